"""The local RL recipe (CPU or one GPU): NPR-Zero and SR with DAPO, NPR with PAPO.

One training step:

1. **Rollouts** from ``components.engine.generate``: ``prompts_per_step`` problems x ``group_size`` samples,
   sequential visibility (NPR-Zero, SR) or native parallel decoding (PAPO).
2. **Rewards** from ``components.grading.rewards.score_many`` (``stage1`` / ``stage3``) plus DAPO's overlong
   penalty when ``overlong_buffer_len > 0``.
3. **Structural filtering** (PAPO): a rollout whose response the canonical mask builder
   (``components.structure``) rejects, or that the reward flags as filtered, is dropped and counted by
   reason; it is never scored.
4. **Dynamic sampling** (DAPO): groups whose rewards are all equal are dropped and refilled from further
   generation batches up to ``max_gen_batches`` (``components.training.dapo.DynamicSampler``).
5. **Advantages and loss** by calling verl's registered functions (``rl_objective``): ``grpo`` + ``vanilla``
   for DAPO, ``papo`` + ``papo`` for PAPO. PAPO is strictly on-policy (``old_log_prob = sg(log_prob)``, no
   old-policy pass). DAPO recomputes old log-probs once per batch only when ``mini_batches > 1`` (with one
   mini-batch the ratio is identically 1 and the pass would be wasted).
6. AdamW step per mini-batch, gradient clipping, LR schedule per training step. A mini-batch runs as
   length-sorted micro-batches of ``micro_batch_size`` rollouts (less padding); verl's ``agg_loss``
   normalises each by the whole mini-batch's token count, so the gradient is that of one batch (tested).

Around it: held-out evaluation (``eval_every``; also before training so the gain over the starting model
is measured) with ``components.grading.judge_many``/``summarize``; checkpoints in the stage's work dir
every ``save_every`` steps and resume from the newest one; per-step metrics appended to
``<work_dir>/metrics.jsonl`` and logged to W&B through ``components.tracking`` (one run per stage); each
filtered rollout's reason in full to ``<work_dir>/rollout_rejections.jsonl`` (metrics count categories).

Resume: a checkpoint carries, besides the weights, optimizer, scheduler and RNG states, everything the run
has logged so far (``records``: the pre-training eval and every step's metrics) and the data cursor. A
resumed run restores them, rewrites ``metrics.jsonl`` from them (so a step logged after the last checkpoint
and replayed is there once) and reports totals over the whole run, exactly what an uninterrupted run
reports; a stage rerun after it finished (``dvc repro -f``) trains nothing and reports the recorded run.
"""

from __future__ import annotations

import json
import logging
import math
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from components.artifacts import atomic_dir
from components.data.problems import load_problems, load_tuning_split
from components.engine import GenerationConfig, generate
from components.engine.generation import exact_semantics
from components.grading.judge import judge_many, summarize
from components.grading.rewards import score_many
from components.progress import track
from components.prompts import render_prompt
from components.structure import TagIds, parse_text, post_merge_mask, trace_metrics
from components.tracking import stage_run
from components.training.checkpoint import TrainingState, latest_checkpoint, load_checkpoint, save_checkpoint
from components.training.config import RLStageConfig
from components.training.dapo import DynamicSampler, DynamicSamplingStats, overlong_penalty
from components.training.job import RLJob
from components.training.papo import post_merge_is_weights
from components.training.precision import build_adamw, compute_autocast, stepped_parameters
from components.training.rl_batch import (
    Rollout,
    build_policy_batch,
    length_sorted_micro_batches,
    response_log_probs,
    response_mask_of,
    structural_violation,
)
from components.training.rl_objective import actor_config, compute_advantages, compute_policy_loss

Group = list[Rollout]
log = logging.getLogger(__name__)
METRICS_LOG = "metrics.jsonl"
# Filtered rollouts with the parser's full message, one JSON line each, in the stage's work dir; metric
# names carry only the reason's category (``rollout/rejected/<code>``), a fixed set.
REJECTIONS_LOG = "rollout_rejections.jsonl"


@dataclass
class RLRunResult:
    """What a run returns to its stage: final metrics (over the whole run, resumed or not), the eval history
    and the per-step metrics of the steps this call trained."""

    metrics: dict[str, Any]
    history: list[dict[str, Any]] = field(default_factory=list)
    evals: list[dict[str, Any]] = field(default_factory=list)


def lr_lambda(stage_cfg: RLStageConfig) -> Callable[[int], float]:
    """Multiplier of the base LR at training step ``s`` (linear warmup, then constant or cosine)."""
    warmup, total, floor = stage_cfg.lr_warmup_steps, max(1, stage_cfg.steps), stage_cfg.min_lr_ratio

    def factor(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        if stage_cfg.lr_scheduler == "constant":
            return 1.0
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor


class RLTrainer:
    """One RL stage on a local model. ``run()`` trains (resuming if a checkpoint exists) and evaluates.

    ``job`` is the stage's settings, read once (``components.training.job.rl_job``); the trainer reads its
    section, schema, merge semantics, prompts, grading, compute precision and generation extras from it."""

    def __init__(
        self,
        job: RLJob,
        model: Any,
        tokenizer: Any,
        train_problems: list[dict[str, Any]],
        eval_problems: list[dict[str, Any]],
        work_dir: Path,
        tracker: Any | None = None,
    ) -> None:
        self.job = job
        self.stage = stage = job.stage
        self.sc = job.section
        self.schema = job.schema
        # what post-merge tokens see in the trainer's forward (components.structure.merge)
        self.merge = job.merge_semantics
        self.generation = dict(job.generation)
        self.model, self.tokenizer = model, tokenizer
        if not train_problems:
            raise ValueError(f"{stage}: no training problems")
        if not eval_problems:
            raise ValueError(f"{stage}: no held-out problems to evaluate on")
        self.train_problems = list(train_problems)
        self.eval_problems = list(eval_problems)[: self.sc.eval_n]
        self.work_dir = Path(work_dir)
        self.work_dir.mkdir(parents=True, exist_ok=True)
        if self.sc.engine_mode == "parallel" and not self.sc.structural_filter:
            # the 4D mask only exists for well-formed traces: malformed parallel rollouts must be filtered
            raise ValueError(f"{stage}: engine_mode 'parallel' needs structural_filter: true")
        needs_tags = self.sc.engine_mode == "parallel" or self.sc.structural_filter
        self.tags = TagIds.from_tokenizer(tokenizer, self.schema) if needs_tags else None
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.actor_cfg = actor_config(self.sc)
        # fp32 master weights and AdamW state when the model is bf16 (components.training.precision)
        self.optimizer = build_adamw(
            model, lr=self.sc.lr, betas=tuple(self.sc.adam_betas), weight_decay=self.sc.weight_decay
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_lambda(self.sc))
        self.order = list(range(len(self.train_problems)))
        random.Random(self.sc.seed).shuffle(self.order)
        self.cursor = 0  # position in `order` of the next training problem (saved with checkpoints)
        self.step = 0
        self.evals: list[dict[str, Any]] = []
        # every record logged so far (metrics.jsonl lines): saved with checkpoints, restored on resume
        self.records: list[dict[str, Any]] = []
        self.resumed_from_step = 0
        self.tracker = tracker  # a components.tracking.StageRun, or None
        # rollouts filtered out in the current step, with the parser's message (-> rollout_rejections.jsonl)
        self.rejections: list[dict[str, Any]] = []
        # which process wrote a record: a resumed run replays the steps after its checkpoint
        self.segment = f"{time.time_ns():x}"

    # ----------------------------------------------------------------------------------- generation
    def _gen_cfg(self, mode: str, temperature: float, top_p: float, seed: int) -> GenerationConfig:
        return GenerationConfig(
            mode=mode,
            temperature=temperature,
            top_p=top_p,
            max_new_tokens=self.sc.max_new_tokens,
            batch_size=max(1, self.sc.prompts_per_step * self.sc.group_size),
            step_repetition_penalty=1.0,
            seed=seed,
            merge_mode=self.sc.merge_mode,
            **self.generation,
        )

    def _prompt(self, problem: dict[str, Any]) -> str:
        return render_prompt(self.tokenizer, problem["problem"], self.job.prompts, self.sc.prompt_style)

    def _next_problems(self, n: int) -> list[dict[str, Any]]:
        out = []
        for _ in range(n):
            out.append(self.train_problems[self.order[self.cursor % len(self.order)]])
            self.cursor += 1
        return out

    def _rollout_groups(self, gen_index: int, counters: Counter) -> list[Group]:
        """One generation batch: sample, score and (PAPO) structurally filter; returns groups of survivors."""
        n_prompts = self.sc.gen_batch_prompts or self.sc.prompts_per_step
        problems = self._next_problems(n_prompts)
        prompts = [self._prompt(p) for p in problems for _ in range(self.sc.group_size)]
        seed = self.sc.seed * 1_000_003 + self.step * 1_009 + gen_index
        self.model.eval()
        start = time.perf_counter()
        with torch.no_grad():
            gens = generate(
                self.model,
                self.tokenizer,
                prompts,
                self._gen_cfg(self.sc.engine_mode, self.sc.temperature, self.sc.top_p, seed),
                self.tags,
            )
        counters["rollout_time_s"] += time.perf_counter() - start
        golds = [str(p["answer"]) for p in problems for _ in range(self.sc.group_size)]
        results = score_many(
            self.sc.reward,
            [g.text for g in gens],
            golds,
            self.schema,
            self.job.grading,
            # A rollout cut off by the token budget has no answer, so no correct-answer reward.
            finish_reasons=[g.finish_reason for g in gens],
            # scheduled rewards (Parallel-R1's alternating one) read the 1-based step being trained
            step=self.step + 1,
        )

        rollouts: list[Rollout] = []
        for i, (gen, res) in enumerate(zip(gens, results, strict=True)):
            problem = problems[i // self.sc.group_size]
            stop = [gen.stop_token_id] if gen.stop_token_id is not None else []
            rollouts.append(
                Rollout(
                    group_id=f"s{self.step}-b{gen_index}-p{i // self.sc.group_size}",
                    problem_id=str(problem["id"]),
                    answer=str(problem["answer"]),
                    prompt_ids=list(gen.prompt_ids),
                    response_ids=list(gen.token_ids) + stop,
                    text=gen.text,
                    finish_reason=gen.finish_reason,
                    parallel_taken=gen.parallel_taken,
                    forked_at=tuple(b.start for b in gen.blocks) if self.sc.engine_mode == "parallel" else None,
                    reward=res.score,
                    correct=res.correct,
                    valid=res.valid,
                    format_score=res.format_score,
                    extra={
                        "filtered_by_reward": res.filtered,
                        # what PAPO's post-merge correction reads (rollout_correction): the log-probs the
                        # tokens were sampled with, and whether the merges were re-prefilled
                        "rollout_logprobs": list(gen.logprobs) + ([gen.stop_logprob] if stop else []),
                        "merge_mode": gen.merge_mode,
                    },
                )
            )
            counters["generated_tokens"] += len(gen.token_ids)
        counters["rollouts"] += len(rollouts)
        counters["rollouts_truncated"] += sum(r.truncated for r in rollouts)
        # parallel rate = the trace holds >= 1 valid block with >= 2 plans (the paper's trigger rate), whatever
        # the decoding; the engine's fork rate is reported separately
        counters["rollouts_parallel"] += sum(self._is_parallel(r.text) for r in rollouts)
        counters["rollouts_forked"] += sum(r.parallel_taken for r in rollouts)
        counters["rollouts_valid"] += sum(r.valid for r in rollouts)
        counters["rollouts_correct_and_valid"] += sum(r.correct and r.valid for r in rollouts)
        counters["response_tokens"] += sum(len(r.response_ids) for r in rollouts)
        if self.sc.overlong_buffer_len > 0:
            lengths = torch.tensor([len(r.response_ids) for r in rollouts])
            penalties = overlong_penalty(
                lengths, self.sc.max_new_tokens, self.sc.overlong_buffer_len, self.sc.overlong_penalty_factor
            )
            for r, pen in zip(rollouts, penalties.tolist(), strict=True):
                r.reward += pen
                counters["overlong_penalised"] += pen < 0

        kept: list[Rollout] = []
        for r in rollouts:
            # reason: a category from a fixed set (metric names); detail: free text for the records only
            reason, detail = None, ""
            if not r.response_ids:
                reason = "empty_response"
            elif self.sc.structural_filter:
                violation = structural_violation(r, self.tags)
                if violation is not None:
                    reason, detail = violation.code, str(violation)
                elif r.extra["filtered_by_reward"]:
                    reason = "reward_filtered"
            if reason is None:
                kept.append(r)
            else:
                counters["structurally_rejected"] += 1
                counters[f"rejected/{reason}"] += 1
                self.rejections.append(
                    {"group_id": r.group_id, "problem_id": r.problem_id, "reason": reason, "detail": detail}
                )
        groups: dict[str, Group] = {}
        for r in kept:
            groups.setdefault(r.group_id, []).append(r)
        counters["groups_generated"] += n_prompts
        counters["groups_zero_std"] += sum(
            1 for g in groups.values() if len(g) > 1 and float(np.std([r.reward for r in g])) == 0.0
        )
        counters["groups_emptied"] += n_prompts - len(groups)
        return list(groups.values())

    # ----------------------------------------------------------------------------------- update
    def _update(self, groups: list[Group], counters: Counter) -> dict[str, float]:
        rollouts = [r for g in groups for r in g]
        self.model.train()
        start = time.perf_counter()
        # Every tensor of the step lives on the model's device; statistics stay there as tensors until the
        # step is done (one host sync per step, not one per micro-batch).
        device = next(self.model.parameters()).device
        rewards = torch.tensor([r.reward for r in rollouts], dtype=torch.float32)
        uids = [r.group_id for r in rollouts]
        parallel_tags = self.tags if self.sc.engine_mode == "parallel" else None
        # the advantages need only the response layout: no attention inputs for the whole batch
        response_mask = response_mask_of(rollouts)
        advantages = compute_advantages(
            self.sc.algorithm, rewards, response_mask, uids, self.sc.norm_adv_by_std
        ).to(device)

        chunks = [
            c
            for c in np.array_split(np.arange(len(groups)), min(self.sc.mini_batches, len(groups)))
            if len(c)
        ]
        offsets = np.cumsum([0] + [len(g) for g in groups])
        # Each mini-batch (one optimizer step) runs as micro-batches of similar length (less padding).
        micro_of: list[list[list[int]]] = []
        for c in chunks:
            idx = [i for gi in c for i in range(offsets[gi], offsets[gi + 1])]
            micro_of.append(length_sorted_micro_batches(rollouts, idx, self.sc.micro_batch_size))
        old_log_probs: dict[tuple[int, int], torch.Tensor] = {}
        if self.sc.algorithm != "papo" and len(chunks) > 1:
            # decoupled PPO: the rollout policy's log-probs, computed once before the first update
            with torch.no_grad():
                for k, micros in enumerate(micro_of):
                    for m, idx in enumerate(micros):
                        batch = build_policy_batch(
                            [rollouts[i] for i in idx], self.pad_id, parallel_tags, self.merge
                        )
                        with compute_autocast(self.job.run.autocast, device):
                            old_log_probs[k, m], _ = response_log_probs(
                                self.model, batch.to(device), self.sc.temperature
                            )

        stats: dict[str, list[torch.Tensor]] = {
            k: [] for k in ("loss", "grad_norm", "entropy", "clipfrac", "kl")
        }
        for k, micros in enumerate(micro_of):
            idx_all = [i for idx in micros for i in idx]
            n_tokens = sum(len(rollouts[i].response_ids) for i in idx_all)
            # verl's agg_loss divides each micro-batch's sum by the whole mini-batch's token (or sequence)
            # count, so the micro-batch losses add up to the loss of the mini-batch as one batch.
            # (a dict field of the frozen ActorConfig, updated in place as verl's own actor does)
            self.actor_cfg.global_batch_info.update(
                dp_size=1, batch_num_tokens=n_tokens, global_batch_size=len(idx_all)
            )
            self.optimizer.zero_grad(set_to_none=True)
            sums = torch.zeros(4, dtype=torch.float64, device=device)  # loss, entropy, clipfrac, kl
            for m, idx in enumerate(micros):
                batch = build_policy_batch(
                    [rollouts[i] for i in idx], self.pad_id, parallel_tags, self.merge
                ).to(device)
                with compute_autocast(self.job.run.autocast, device):  # the policy forward's compute dtype
                    log_prob, entropy = response_log_probs(
                        self.model, batch, self.sc.temperature, with_entropy=True
                    )
                old = old_log_probs.get((k, m), log_prob.detach())
                adv = advantages[idx][:, : log_prob.shape[1]]
                weights = self._post_merge_weights([rollouts[i] for i in idx], log_prob, batch, counters)
                loss, loss_metrics = compute_policy_loss(
                    self.sc.algorithm, old, log_prob, adv, batch.response_mask, self.actor_cfg, weights
                )
                loss.backward()
                share = batch.response_mask.sum().double() / n_tokens
                assert entropy is not None
                sums += torch.stack(
                    [
                        loss.detach().double(),
                        (entropy * batch.response_mask).sum().double() / n_tokens,
                        share * float(loss_metrics.get("actor/pg_clipfrac", 0.0)),
                        share * float(loss_metrics.get("actor/ppo_kl", 0.0)),
                    ]
                )
            grad_norm = torch.nn.utils.clip_grad_norm_(
                stepped_parameters(self.model, self.optimizer), self.sc.grad_clip
            )
            if torch.isfinite(grad_norm):
                self.optimizer.step()
            else:
                counters["skipped_nonfinite_grad"] += 1
            for key, value in zip(("loss", "entropy", "clipfrac", "kl"), sums, strict=True):
                stats[key].append(value)
            stats["grad_norm"].append(grad_norm.detach().double())
        self.scheduler.step()
        means = {key: float(torch.stack(values).mean()) for key, values in stats.items()}
        counters["update_time_s"] += time.perf_counter() - start
        counters["trained_tokens"] += int(response_mask.sum())
        return {
            "actor/pg_loss": means["loss"],
            "actor/grad_norm": means["grad_norm"],
            "actor/entropy": means["entropy"],
            "actor/pg_clipfrac": means["clipfrac"],
            "actor/ppo_kl": means["kl"],
            "actor/lr": float(self.scheduler.get_last_lr()[0]),
            "actor/optimizer_steps": float(len(micro_of)),
        }

    def _post_merge_weights(
        self, rollouts: list[Rollout], log_prob: torch.Tensor, batch: Any, counters: Counter
    ) -> torch.Tensor | None:
        """PAPO's truncated importance weights on tokens sampled after a re-prefilled merge
        (``papo.post_merge_is_weights``), or None when no rollout of the micro-batch needs them.

        Rollouts merged in the shared KV under ``isolated`` semantics (the torch engine's default) are exact
        and never reweighted. Re-prefilled rollouts always get the weights: under ``isolated`` they correct
        the re-read context; under ``reread`` the trainer's forward is that context, so the weights are 1 up
        to numerics and the metrics measure it. The mismatch metrics are summed into ``counters`` (means in
        the step metrics).
        """
        rc = self.sc.rollout_correction
        if self.sc.algorithm != "papo" or not rc.post_merge_is or self.tags is None:
            return None
        reprefilled = [
            r.extra.get("merge_mode") == "reprefill"
            or exact_semantics(r.extra.get("merge_mode", "shared_kv")) != self.merge
            for r in rollouts
        ]
        if not any(reprefilled):
            return None
        rollout_lp = torch.full_like(log_prob, float("nan"))
        merged = torch.zeros(log_prob.shape, dtype=torch.bool, device=log_prob.device)
        for b, (r, redo) in enumerate(zip(rollouts, reprefilled, strict=True)):
            if not redo:
                continue
            lps = torch.tensor(r.extra["rollout_logprobs"], dtype=torch.float32)
            rollout_lp[b, : lps.numel()] = lps.to(log_prob.device)
            mask = post_merge_mask(r.prompt_ids + r.response_ids, self.tags, len(r.prompt_ids))
            merged[b, : mask.size] = torch.from_numpy(mask).to(log_prob.device)
        weights, metrics = post_merge_is_weights(
            log_prob, rollout_lp, batch.response_mask, merged, rc.is_threshold
        )
        counters["rollout_corr/micro_batches"] += 1
        for key, value in metrics.items():
            counters[key] += value
        return weights

    # ----------------------------------------------------------------------------------- evaluation
    def _is_parallel(self, text: str) -> bool:
        return trace_metrics(parse_text(text, self.schema)).is_parallel

    def evaluate(self) -> dict[str, Any]:
        """Held-out metrics of the current policy: ``eval_samples`` samples per problem, the stage's engine
        mode; rates are over all samples."""
        problems = [p for p in self.eval_problems for _ in range(self.sc.eval_samples)]
        prompts = [self._prompt(p) for p in problems]
        self.model.eval()
        start = time.perf_counter()
        with torch.no_grad():
            gens = generate(
                self.model,
                self.tokenizer,
                prompts,
                self._gen_cfg(
                    self.sc.engine_mode, self.sc.eval_temperature, self.sc.eval_top_p, self.sc.seed
                ),
                self.tags,
            )
        wall = time.perf_counter() - start
        judgements = judge_many(
            [g.text for g in gens],
            [str(p["answer"]) for p in problems],
            self.schema,
            self.job.grading,
            purpose="evaluation",
            finish_reasons=[g.finish_reason for g in gens],
        )
        summary = summarize(judgements)
        return {
            "step": self.step,
            "format_valid": summary["format_valid"],
            "accuracy": summary["accuracy"],
            "correct_and_valid": summary["correct_and_valid"],
            "mean_format_score": summary["mean_format_score"],
            "parallel_rate": sum(self._is_parallel(g.text) for g in gens) / len(gens),
            "engine_fork_rate": sum(g.parallel_taken for g in gens) / len(gens),
            "response_length_mean": float(np.mean([len(g.token_ids) for g in gens])),
            "n": summary["n"],
            "problems": len(self.eval_problems),
            "wall_s": round(wall, 3),
        }

    # ----------------------------------------------------------------------------------- checkpoints
    def _save(self) -> None:
        extra = {"cursor": self.cursor, "evals": self.evals, "records": self.records}
        save_checkpoint(
            self.work_dir,
            TrainingState(step=self.step, extra=extra),
            self.model,
            self.optimizer,
            self.scheduler,
        )

    def _resume(self) -> bool:
        path = latest_checkpoint(self.work_dir)
        if path is None:
            return False
        state = load_checkpoint(path, self.model, self.optimizer, self.scheduler)
        self.step = self.resumed_from_step = state.step
        self.cursor = int(state.extra.get("cursor", 0))
        self.evals = list(state.extra.get("evals", []))
        self.records = list(state.extra.get("records", []))
        if self.step >= self.sc.steps:
            log.info(
                "%s: already trained to step %d (%s): reporting the recorded run", self.stage, self.step, path
            )
        else:
            log.info("%s: resuming from step %d of %d (%s)", self.stage, self.step, self.sc.steps, path)
        return True

    def _rewrite_log(self) -> None:
        """metrics.jsonl = the restored records: drops what a crashed run logged after its last checkpoint
        (those steps are trained again) and a line a kill cut in half."""
        path = self.work_dir / METRICS_LOG
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in self.records), encoding="utf-8")
        tmp.replace(path)

    # ----------------------------------------------------------------------------------- main loop
    def train_step(self) -> dict[str, Any]:
        counters: Counter = Counter()
        sampler: DynamicSampler[Group] = DynamicSampler(
            generate=lambda k: self._rollout_groups(k, counters),
            scores_of=lambda g: [r.reward for r in g],
            target_groups=self.sc.prompts_per_step,
            max_gen_batches=self.sc.max_gen_batches,
            enabled=self.sc.dynamic_sampling and self.sc.algorithm == "dapo",
        )
        groups, ds_stats = sampler.collect()
        metrics: dict[str, Any] = {"step": self.step + 1}
        if groups:
            metrics.update(self._update(groups, counters))
        else:
            counters["steps_without_update"] += 1
        metrics.update(self._step_metrics(groups, counters, ds_stats))
        self.step += 1
        return metrics

    def _step_metrics(self, groups: list[Group], c: Counter, ds: DynamicSamplingStats) -> dict[str, Any]:
        trained = [r for g in groups for r in g]
        rewards = [r.reward for r in trained]
        n = max(1, c["rollouts"])
        out: dict[str, Any] = {
            "reward/mean": float(np.mean(rewards)) if rewards else float("nan"),
            "reward/std": float(np.std(rewards)) if rewards else float("nan"),
            "frac_reward_zero_std": c["groups_zero_std"] / max(1, c["groups_generated"]),
            "response_length/mean": c["response_tokens"] / n,
            "response_length/clip_ratio": c["rollouts_truncated"] / n,
            "rollout/format_valid": c["rollouts_valid"] / n,
            "rollout/correct_and_valid": c["rollouts_correct_and_valid"] / n,
            "rollout/parallel_rate": c["rollouts_parallel"] / n,
            "rollout/engine_fork_rate": c["rollouts_forked"] / n,
            "rollout/structurally_rejected": float(c["structurally_rejected"]),
            "rollout/groups_emptied_by_filter": float(c["groups_emptied"]),
            "train/num_gen_batches": float(ds.num_gen_batches),
            "train/rollouts_generated": float(c["rollouts"]),
            "train/rollouts_trained": float(len(trained)),
            "train/trained_valid_fraction": (sum(r.valid for r in trained) / len(trained))
            if trained
            else 0.0,
            "perf/tokens_per_s": c["generated_tokens"] / max(1e-9, c["rollout_time_s"]),
            "timing_s/rollout": round(c["rollout_time_s"], 3),
            "timing_s/update": round(c["update_time_s"], 3),
        }
        out.update(ds.as_metrics("dynamic_sampling"))
        if c["rollout_corr/micro_batches"]:
            n_corr = c["rollout_corr/micro_batches"]
            out.update(
                {
                    k: float(v) / n_corr
                    for k, v in c.items()
                    if k.startswith("rollout_corr/") and k != "rollout_corr/micro_batches"
                }
            )
        out.update({f"rollout/{k}": float(v) for k, v in c.items() if k.startswith("rejected/")})
        if c["steps_without_update"]:
            out["train/steps_without_update"] = float(c["steps_without_update"])
        if c["skipped_nonfinite_grad"]:
            out["train/skipped_nonfinite_grad"] = float(c["skipped_nonfinite_grad"])
        return out

    def run(self, max_steps: int | None = None) -> RLRunResult:
        """Train to ``steps`` (or stop after ``max_steps`` more, to simulate an interruption in tests)."""
        resumed = self._resume()
        self._rewrite_log()
        if self.tracker is not None:  # W&B continues after the checkpoint (what a kill lost is logged again)
            self.tracker.resume_from(self.step if resumed else -1)
        if not resumed and self.sc.eval_before_train:
            self.evals.append(self.evaluate())
            self._log({"eval": self.evals[-1]})
        history: list[dict[str, Any]] = []
        done = 0
        with track(f"{self.stage} ({self.sc.algorithm})", total=self.sc.steps, unit="steps") as bar:
            bar.advance(self.step)  # resumed steps
            while self.step < self.sc.steps and (max_steps is None or done < max_steps):
                metrics = self.train_step()
                done += 1
                if self.step % self.sc.eval_every == 0 or self.step == self.sc.steps:
                    self.evals.append(self.evaluate())
                    metrics["eval"] = self.evals[-1]
                history.append(metrics)
                self._log(metrics)
                if self.step % self.sc.save_every == 0 or self.step == self.sc.steps:
                    self._save()
                shown = {"reward": metrics.get("reward/mean"), "valid": metrics["rollout/format_valid"]}
                if self.evals:
                    shown["eval acc"] = self.evals[-1]["accuracy"]
                bar.advance(1, **shown)
        return RLRunResult(metrics=self.summary(), history=history, evals=list(self.evals))

    def summary(self) -> dict[str, Any]:
        """Stage metrics: the last held-out eval, the one before training and the change (when it was
        measured: ``eval_before_train``), and totals over every step of the run (restored ones included)."""
        history = [r for r in self.records if "train/rollouts_trained" in r]
        out: dict[str, Any] = {
            "steps": self.step,
            "resumed_from_step": self.resumed_from_step,
            "algorithm": self.sc.algorithm,
        }
        if self.evals:
            first, last = self.evals[0], self.evals[-1]
            for key in ("format_valid", "accuracy", "correct_and_valid", "parallel_rate"):
                out[f"final/{key}"] = last[key]
                if first["step"] == 0:  # measured before training (eval_before_train), so a gain is known
                    out[f"initial/{key}"] = first[key]
                    out[f"delta/{key}"] = last[key] - first[key]
            # the early accuracy dip while the policy switches format is reported, not hidden
            out["min/accuracy"] = min(e["accuracy"] for e in self.evals)
            out["evals"] = self.evals
        if history:
            trained = sum(h["train/rollouts_trained"] for h in history)
            out["train/rollouts_trained"] = trained
            out["train/rollouts_generated"] = sum(h["train/rollouts_generated"] for h in history)
            out["train/structurally_rejected"] = sum(h["rollout/structurally_rejected"] for h in history)
            out["train/trained_valid_fraction"] = (
                sum(h["train/trained_valid_fraction"] * h["train/rollouts_trained"] for h in history)
                / trained
                if trained
                else 0.0
            )
            out["train/num_gen_batches"] = sum(h["train/num_gen_batches"] for h in history)
            out["perf/tokens_per_s"] = float(np.mean([h["perf/tokens_per_s"] for h in history]))
        return out

    def _log(self, metrics: dict[str, Any]) -> None:
        # a JSON round trip: the record kept for the checkpoint is exactly the line written
        record = json.loads(json.dumps({"stage": self.stage, "step": self.step, **metrics}, default=float))
        self.records.append(record)
        with (self.work_dir / METRICS_LOG).open("a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
        if self.rejections:
            with (self.work_dir / REJECTIONS_LOG).open("a", encoding="utf-8") as f:
                for rec in self.rejections:
                    f.write(json.dumps({"step": self.step, "segment": self.segment, **rec}) + "\n")
            self.rejections = []
        if self.tracker is not None:
            flat = {k: v for k, v in metrics.items() if isinstance(v, (int, float))}
            flat.update(
                {f"eval/{k}": v for k, v in metrics.get("eval", {}).items() if isinstance(v, (int, float))}
            )
            self.tracker.log(flat, step=self.step)


def train_rl(job: RLJob, train_problems: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The body of the RL stages (``npr_zero``, ``papo_rl``, ``sr_rl``, ``pr1_rl``): train, save, return metrics.

    Reads the job's starting model and problems (the train split to train on unless ``train_problems`` are
    given; the held-out evals read the validation split when there is one, else the test split:
    ``load_tuning_split``); writes its model atomically; checkpoints and the step log live in its work dir.
    ``backend: verl`` hands the same job to verl's trainer (``components.training.verl.stage``).
    """
    from components.models.loading import load_model, save_model  # lazy: transformers

    paths = job.stage_paths()
    if job.section.backend == "verl":
        from components.training.verl.stage import run_verl_stage  # lazy: ray

        return run_verl_stage(job, train_problems)
    model, tokenizer = load_model(paths.starts_from, job.models, job.run, for_training=True)
    train = train_problems if train_problems is not None else load_problems(paths.problems, "train")
    _, test = load_tuning_split(paths.problems)
    paths.work_dir.mkdir(parents=True, exist_ok=True)
    # inside a stage (components.stages.run_stage) this joins the stage's run, opened with the whole config
    with stage_run(job.tracking, job.stage, paths.work_dir) as tracker:
        trainer = RLTrainer(job, model, tokenizer, train, test, paths.work_dir, tracker)
        result = trainer.run()
        tracker.summary({k: v for k, v in result.metrics.items() if isinstance(v, (int, float))})
    with atomic_dir(paths.writes) as tmp:
        save_model(model, tokenizer, tmp)
    return result.metrics
