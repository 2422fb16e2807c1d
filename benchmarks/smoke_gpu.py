"""Device smoke test: one script, one GPU, no network, prints one table (docs/results.md keeps it).

On the GPU node (the device tool's nvidia-h100-x1 / nvidia-h200: Python 3.12, torch, triton, transformers,
tokenizers, safetensors, accelerate; no network, 64 MiB carried per call), from the checkout's root:

    python benchmarks/smoke_gpu_wheels.py     # here, once: the wheels the node lacks -> .smoke-wheels/ (2.7 MiB)
    bash benchmarks/smoke_gpu.sh              # there (carry .smoke-wheels): installs them offline, runs this
                                              # script, writes $OUT/smoke.md and $OUT/smoke.json
    python benchmarks/smoke_gpu.py --cpu      # the same code on CPU, small shapes (about 10 s on 2 cores);
                                              # --dtype bfloat16 for the bf16 path (fp32 masters) there too

It runs what a GPU alone can show, at the shapes of the one-GPU profile (``--profile``, default
``qwen3-1.7b-1gpu``; ``profile_sizes``): a random-init model of its ``models.architecture`` (Qwen3-1.7B) in
bf16, its parallel SFT row (``parallel_warmup.max_length``) and its PAPO rollouts (``papo_rl``'s prompt
bound + ``max_new_tokens``) under its ``merge_semantics`` (``--cpu``: a small Qwen3 in fp32, 512-token rows,
``isolated``), through the project's own code:

- **Exact merge.** Parallel responses from the torch engine (``components.engine``, a forced
  ``<guideline>`` of three plans: the engine forks at ``</guideline>`` and merges at ``<takeaway>``); the
  log-probs it recorded against the trainer's teacher forcing (``rl_batch.build_policy_batch`` +
  ``response_log_probs``): mean, p99 and max of the absolute difference over the post-merge tokens
  (``components.structure.post_merge_mask``), the pre-merge ones in the note. Three rows: merge_mode
  ``shared_kv`` against the trainer's ``isolated`` semantics (exact), ``reprefill`` against ``isolated`` (off after the
  merge: the contrast) and ``reprefill`` against ``reread`` (exact). The random model never closes its
  ``<takeaway>``; a closing tag is appended after the last compared token (causal: it changes none).
- **Decode speed**, sequential and parallel through the engine, at batch 1 (1024 new tokens) and batch 64
  (512), with the parallel/sequential tokens/s ratio.
- **One parallel-mask SFT step** (``sft._train_step``, ``build_optimizer``: ``MasterWeightAdamW``, fp32
  masters under bf16 weights) on the profile's SFT row and **one PAPO update** on two parallel rollouts of
  the profile's PAPO length, each with its
  measured peak (``memory_probe``) beside the planner's estimate (``components.training.memory``). The
  update is ``RLTrainer._update`` where verl is installed; the node has no verl (it needs Ray), so there
  it is the trainer's own parts (batch, log-probs, ``build_adamw``, one micro-batch per rollout, clipping)
  with the on-policy token-mean surrogate ``-A * exp(logp - sg(logp))`` for verl's PAPO loss; the row says
  which.

Not yet run at these shapes on a GPU (it was sized for a 4B at 4096-token rows): at the one-GPU
profile's the SFT step is a 32768-token row (plus its re-read copies) and the PAPO update 2 x 18048 tokens,
each row printing the planner's peak for exactly what it ran beside the measured one (the one-GPU profile's
own plan for parallel_warmup is 57.8 GiB of an H100's 75.6 usable). The decode rows run last, and one that would start after
``--budget-s`` (default 360 s) is skipped with a row saying so. The table is rewritten to --out after each
part, so a run cut short keeps what it measured; the last row is the total wall time.

Part 1, ``--stages sample_orz,seed,...`` (a prefix of the tiny chain, default none), runs the tiny
profile's stages a few steps each through the stage runner in a scratch workspace. It needs the
project's whole environment (W&B for every stage's run, Great Expectations for sample_orz and
reject_filter, verl for npr_zero and papo_rl), which the node does not have, and what it shows beyond
part 2 is pipeline plumbing the CPU tests cover; so the node command leaves it out.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import gc
import importlib.util
import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

SMALL = dict(hidden=128, intermediate=384, layers=2, heads=4, kv_heads=2, head_dim=32, vocab=2048)

Row = tuple[str, str, str, str]  # what, measured, planner, note


def _fmt_gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


def _metric_text(metrics: dict, *keys: str) -> str:
    """``key value`` for each of ``keys`` the stage's metrics really hold (a missing or None one is left out)."""
    parts = []
    for key in keys:
        value = metrics.get(key)
        if value is None:
            continue
        parts.append(f"{key} {value:.3g}" if isinstance(value, float) else f"{key} {value}")
    return ", ".join(parts) or "metrics: " + ", ".join(sorted(metrics)[:8])


# ------------------------------------------------------------------------------------------ part 1
def tiny_chain() -> list[str]:
    """Part 1's stages: the NPR branch up to PAPO in dvc.yaml's order (components.dag), then evaluate. Read
    only for part 1: the node runs part 2 without the project's config dependencies."""
    from components.dag import chain_to

    return [*chain_to("papo_rl", ROOT / "dvc.yaml"), "evaluate"]


def stage_overrides(device: str, dtype: str, cpu: bool) -> list[str]:
    from components.config import model_stages, rl_stages

    chain = tiny_chain()
    few = {
        f"run.device={device}",
        f"run.dtype={dtype}",
        "run.torch_threads=2",
        "tracking.mode=disabled",  # no W&B run per stage: the smoke measures the stages, not tracking
        "grading.workers=1",
        "sample_orz.synthetic_pool=600",
        "sample_orz.n=300",
        "sample_orz.test_n=16",
        "sample_orz.val_n=16",
        "seed.steps=" + ("6" if cpu else "200"),
        "seed.save_every=100",
        "seed.eval_n=8",
        "models.tiny.tokenizer_corpus_size=" + ("400" if cpu else "4000"),
        "distill.n_problems=8",
        "distill.k=2",
        "reject_filter.min_acceptance_rate=0.0",
        "parallel_warmup.max_steps=2",
        "parallel_warmup.batch_size=4",
        # the chain's checkpoints, the ones trained with the parallel layout decoding in parallel
        f"evaluate.checkpoints=[{','.join(s for s in chain if s in model_stages())}]",
        "evaluate.parallel_checkpoints=[" + ",".join(_parallel_checkpoints(chain)) + "]",
        "evaluate.benchmarks=[{name: tiny_test, n_samples: 1, k: 1, max_problems: 8}]",
    }
    for rl in (s for s in chain if s in rl_stages()):  # the chain's RL stages, one short step each
        few |= {
            f"{rl}.steps=1",
            f"{rl}.prompts_per_step=2",
            f"{rl}.gen_batch_prompts=2",
            f"{rl}.group_size=4",
            f"{rl}.eval_n=4",
            f"{rl}.eval_samples=1",
            f"{rl}.eval_before_train=false",
            f"{rl}.max_gen_batches=1",
            f"{rl}.save_every=1",
        }
    return sorted(few)


def _synthetic_accepted(cfg, directory: Path) -> int:
    """Parallel-format solutions of the synthetic task family, as accepted-trajectory records."""
    from components.artifacts import write_shards
    from components.data import synthetic

    rng = random.Random(0)
    rows = []
    for i, p in enumerate(synthetic.generate_problems(16, seed=3)):
        text = synthetic.render_parallel(synthetic.expression_of(p), rng)
        rows.append(
            {
                **p,
                "problem_id": p["id"],
                "sample_idx": 0,
                "prompt": "",
                "response": text,
                "correct": True,
                "valid": True,
                "format_score": 0.0,
                "finish_reason": "stop",
                "n_tokens": 0,
                "answer_pred": p["answer"],
                "structure": {},
                "idx": i,
            }
        )
    shutil.rmtree(directory, ignore_errors=True)
    write_shards(directory, rows, 1)
    return len(rows)


def _parallel_checkpoints(chain: list[str]) -> list[str]:
    """The tiny profile's parallel-decoding checkpoints that the chain trains."""
    from components.config import load_config

    return [s for s in load_config(profile="tiny").evaluate.parallel_checkpoints if s in chain]


def _stage_detail(section: Any, metrics: dict) -> str:
    """A stage row's note, by the stage's kind (its config section's type)."""
    from components.data.config import RejectFilterConfig
    from components.engine.config import DistillConfig
    from components.models.config import SeedConfig
    from components.training.config import RLStageConfig, SFTStageConfig

    if isinstance(section, SeedConfig):
        return _metric_text(metrics, "steps", "final_loss", "accuracy", "format_valid")
    if isinstance(section, RLStageConfig):
        # a parallel RL stage's telling number is the rollouts its structural filter kept; a sequential
        # one's, how many answers are well formed
        if section.engine_mode == "parallel":
            return f"rollouts {metrics.get('train/rollouts_trained', 0):.0f}"
        return f"format-valid {metrics.get('final/format_valid', 0):.2f}"
    if isinstance(section, DistillConfig):
        return f"{metrics.get('trajectories', metrics.get('n_trajectories', '?'))} trajectories"
    if isinstance(section, RejectFilterConfig):
        return f"accepted {metrics.get('accepted', '?')}"
    if isinstance(section, SFTStageConfig):
        return _metric_text(metrics, "steps", "final_loss")
    return ""


def run_tiny_stages(device: torch.device, cpu: bool, stages: list[str]) -> list[Row]:
    from components.config import materialise_profile
    from components.stages import run_stage
    from components.stages.reject_filter import QualityGateError
    from components.training.memory_probe import measure

    dtype = "float32" if device.type == "cpu" else "bfloat16"
    rows: list[Row] = []
    home = Path.cwd()
    work = Path(tempfile.mkdtemp(prefix="npr-smoke-"))
    try:
        for name in ("dvc.yaml", "configs", "prompts", "components", "flows", "eval", "models"):  # models: the seed
            (work / name).symlink_to(ROOT / name)
        os.chdir(work)
        cfg = materialise_profile("tiny", stage_overrides(device.type, dtype, cpu), dest=work / "params.yaml")
        for stage in stages:
            note = ""
            start = time.perf_counter()
            with measure(device) as reading:
                try:
                    metrics = run_stage(stage, cfg)
                except QualityGateError as err:  # a few seed steps accept nothing: train on the task family
                    accepted = work / "artifacts" / "reject_filter" / "accepted"
                    metrics = {"accepted": _synthetic_accepted(cfg, accepted)}
                    note = f"{err}; the warmup trains on {metrics['accepted']} synthetic parallel solutions"
            wall = time.perf_counter() - start
            detail = _stage_detail(getattr(cfg, stage), metrics)
            rows.append(
                (
                    f"stage {stage} on {device.type}",
                    f"{wall:.1f} s, peak {_fmt_gib(reading.peak_bytes)}",
                    "",
                    "; ".join(x for x in (detail, note) if x),
                )
            )
    finally:
        os.chdir(home)
        shutil.rmtree(work, ignore_errors=True)
    return rows


# ------------------------------------------------------------------------------------------ part 2
def build_model(shape: dict, device: torch.device, dtype: torch.dtype):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        hidden_size=shape["hidden"], intermediate_size=shape["intermediate"], num_hidden_layers=shape["layers"],
        num_attention_heads=shape["heads"], num_key_value_heads=shape["kv_heads"], head_dim=shape["head_dim"],
        vocab_size=shape["vocab"], max_position_embeddings=40960, tie_word_embeddings=True,
    )  # fmt: skip
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen3ForCausalLM(config)
    return model.to(dtype)


PROMPT = [{"role": "user", "content": "2 + 3 * 4 = ?"}]
# a forced response prefix that ends at </guideline>: the engine forks there into three <step> branches
FORCED = "<guideline><plan>1: left</plan><plan>2: right</plan><plan>3: check</plan></guideline>"


def _parallel_generations(model, tok, tags, batch: int, new_tokens: int, merge_mode: str = "shared_kv"):
    from components.engine import GenerationConfig, generate

    prompt = tok.apply_chat_template(PROMPT, tokenize=False, add_generation_prompt=True)
    cfg = GenerationConfig(
        mode="parallel", temperature=1.0, max_new_tokens=new_tokens, batch_size=batch, seed=0,
        max_step_tokens=max(2, new_tokens // 5), min_step_tokens=1, merge_mode=merge_mode,
    )  # fmt: skip
    with torch.no_grad():
        return generate(model, tok, [prompt] * batch, cfg, tags, response_prefixes=[FORCED] * batch)


def _rollouts_of(gens) -> list:
    """The engine's responses as the RL trainer keeps them (``RLTrainer._rollout_groups``)."""
    from components.training.rl_batch import Rollout

    return [
        Rollout(group_id="g", problem_id="p", answer="", prompt_ids=list(g.prompt_ids),
                response_ids=list(g.token_ids) + ([g.stop_token_id] if g.stop_token_id is not None else []),
                text=g.text, finish_reason=g.finish_reason, parallel_taken=g.parallel_taken,
                extra={"merge_mode": g.merge_mode, "rollout_logprobs": list(g.logprobs)})
        for g in gens
    ]  # fmt: skip


def _stats(parts: list[torch.Tensor]) -> str:
    v = torch.cat(parts).double() if parts else torch.zeros(0)
    if v.numel() == 0:
        return "no tokens"
    return f"mean {v.mean():.2e}, p99 {torch.quantile(v, 0.99):.2e}, max {v.max():.2e}"


def exact_merge_rows(model, tok, tags, batch: int, new_tokens: int, micro: int = 4) -> list[Row]:
    """The engine's recorded log-probs of its parallel responses against the trainer's teacher forcing.

    ``shared_kv`` (the torch engine's merge: the branches' own KV behind the parallel mask) must agree with
    the trainer's default (``isolated``) batch after the merge as well as before it; ``reprefill`` (the
    branches re-read as one sequential text, what a stock server does) disagrees with it after the merge,
    and must agree with the trainer's ``reread`` semantics (``components.structure.merge``).
    """
    from components.structure import post_merge_mask
    from components.training.rl_batch import build_policy_batch, response_log_probs, structural_rejection

    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    rows: list[Row] = []
    for merge_mode, semantics in (("shared_kv", ("isolated",)), ("reprefill", ("isolated", "reread"))):
        start = time.perf_counter()
        gens = _parallel_generations(model, tok, tags, batch, new_tokens, merge_mode)
        wall = time.perf_counter() - start
        # A random-init model never closes its <takeaway>: the response ends inside it (finish "length").
        # The trainer's strict parser wants it closed, so a closing tag is appended after the last compared
        # token (causal: no compared token's log-prob can depend on it); the rest is the trainer's filter.
        kept = []
        for g, r in zip(gens, _rollouts_of(gens), strict=True):
            if structural_rejection(r, tags) and g.finish_reason == "length":
                r.response_ids.append(tags.ids["</takeaway>"])
            if not structural_rejection(r, tags):
                kept.append((g, r))
        gens, rollouts = [g for g, _ in kept], [r for _, r in kept]
        forked = sum(g.parallel_taken for g in gens)
        masks = [
            torch.from_numpy(post_merge_mask(r.prompt_ids + r.response_ids, tags, len(r.prompt_ids)))[
                : len(g.token_ids)
            ]
            for g, r in kept
        ]
        post_tokens = sum(int(m.sum()) for m in masks)
        for semantic in semantics:
            what = f"exact merge: engine {merge_mode} vs trainer {semantic}, post-merge abs Δlogp"
            post, pre = [], []
            with torch.no_grad():
                for i in range(0, len(rollouts), micro):
                    part = rollouts[i : i + micro]
                    lp, _ = response_log_probs(model, build_policy_batch(part, pad, tags, semantic))
                    for b, g in enumerate(gens[i : i + micro]):
                        n = len(g.token_ids)
                        diff = (lp[b, :n].float().cpu() - torch.tensor(g.logprobs, dtype=torch.float32)).abs()
                        mask = masks[i + b]
                        post.append(diff[mask])
                        pre.append(diff[~mask])
            rows.append(
                (what, _stats(post), "",
                 f"pre-merge {_stats(pre)}; {post_tokens} post-merge tokens; {len(gens)}/{batch} well-formed, "
                 f"{forked} forked; "
                 f"{batch} x {new_tokens} new tokens decoded in {wall:.1f} s")
            )  # fmt: skip
    return rows


def decode_rows(model, tok, tags, new_tokens: int, batch: int) -> list[Row]:
    from components.engine import GenerationConfig, generate

    prompt = tok.apply_chat_template(PROMPT, tokenize=False, add_generation_prompt=True)
    out = []
    speed = {}
    for mode in ("sequential", "parallel"):
        cfg = GenerationConfig(
            mode=mode, temperature=1.0, max_new_tokens=new_tokens, batch_size=batch, seed=0,
            max_step_tokens=max(2, new_tokens // 4), min_step_tokens=1,
        )  # fmt: skip
        start = time.perf_counter()
        with torch.no_grad():
            gens = generate(model, tok, [prompt] * batch, cfg, tags, response_prefixes=[FORCED] * batch)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        wall = time.perf_counter() - start
        tokens = sum(len(g.token_ids) for g in gens)
        critical = max(g.critical_path_tokens for g in gens)
        speed[mode] = tokens / wall
        forks = sum(g.parallel_taken for g in gens)
        out.append((f"decode {mode}, batch {batch} x {new_tokens} new tokens", f"{speed[mode]:.0f} tokens/s", "",
                    f"{tokens} tokens in {wall:.1f} s ({critical} on the longest critical path); forked {forks}/{batch}"))  # fmt: skip
    out.append(
        (
            f"decode parallel / sequential, batch {batch}",
            f"{speed['parallel'] / speed['sequential']:.2f}x",
            "",
            "tokens/s ratio",
        )
    )
    return out


def parallel_example(tok, tags, length: int, filler_text: str = " 1"):
    """One parallel-format row of ``length`` tokens (plans, branches, takeaway) for the SFT step."""
    from components.training.sft_data import SFTExample

    head = tok.encode("<guideline><plan>1: a</plan><plan>2: b</plan></guideline>", add_special_tokens=False)
    step_open, step_close = tok.convert_tokens_to_ids("<step>"), tok.convert_tokens_to_ids("</step>")
    take_open, take_close = tok.convert_tokens_to_ids("<takeaway>"), tok.convert_tokens_to_ids("</takeaway>")
    prompt = tok.encode("solve", add_special_tokens=False)
    filler = tok.encode(filler_text, add_special_tokens=False)
    branch = max(4, (length - len(prompt) - len(head) - 8) // 3)
    ids = prompt + head
    for label in ("1:", "2:"):
        ids += [step_open] + tok.encode(label, add_special_tokens=False) + filler * branch + [step_close]
    ids += [take_open] + filler * branch + [take_close, tok.eos_token_id]
    return SFTExample(tuple(ids), len(prompt), 0)


def _optimizer_text(optimizer, model) -> str:
    from components.training.precision import uses_master_weights

    return f"{type(optimizer).__name__} ({'fp32 masters' if uses_master_weights(model) else 'no masters'})"


def _verl_importable() -> bool:
    return importlib.util.find_spec("verl") is not None


def _papo_update_without_verl(model, rollouts, pad_id, tags, cfg) -> tuple[dict[str, float], str]:
    """One PAPO-shaped update from the RL trainer's own parts, for a machine without verl (the GPU node).

    The batch (``build_policy_batch``, parallel mask), the log-probs (``response_log_probs``, chunked
    vocabulary projection, entropy), the optimizer (``build_adamw``: fp32 masters for a bf16 model), one
    micro-batch per rollout and the clipped step are ``RLTrainer._update``'s; only the policy loss is not
    verl's: the on-policy token-mean ``-A * exp(logp - sg(logp))`` (verl's PAPO loss at ratio 1, which a
    first update on fresh rollouts is) with group-normalised advantages.
    """
    from components.training.precision import build_adamw, stepped_parameters
    from components.training.rl_batch import build_policy_batch, response_log_probs

    sc = cfg.papo_rl
    optimizer = build_adamw(model, lr=sc.lr, betas=tuple(sc.adam_betas), weight_decay=sc.weight_decay)
    rewards = torch.tensor([r.reward for r in rollouts], dtype=torch.float32)
    advantages = (rewards - rewards.mean()) / (rewards.std() + 1e-6)
    n_tokens = sum(len(r.response_ids) for r in rollouts)
    optimizer.zero_grad(set_to_none=True)
    total = 0.0
    for r, a in zip(rollouts, advantages, strict=True):
        batch = build_policy_batch([r], pad_id, tags, cfg.merge_semantics).to(next(model.parameters()).device)
        log_prob, _ = response_log_probs(model, batch, sc.temperature, with_entropy=True)
        ratio = torch.exp(log_prob - log_prob.detach())
        loss = -(a.to(log_prob.device) * ratio * batch.response_mask).sum() / n_tokens
        loss.backward()
        total += float(loss.detach())
    grad_norm = torch.nn.utils.clip_grad_norm_(stepped_parameters(model, optimizer), sc.grad_clip)
    optimizer.step()
    name = _optimizer_text(optimizer, model)
    if hasattr(optimizer, "remove_hooks"):
        optimizer.remove_hooks()
    del optimizer
    return {"actor/pg_loss": total, "actor/grad_norm": float(grad_norm)}, name


def _semantics_overrides(merge: str) -> list[str]:
    """The tiny profile under merge semantics ``merge``: under reread every parallel decode re-reads its
    merges (the config refuses it otherwise; README, "Merge semantics")."""
    if merge != "reread":
        return [f"merge_semantics={merge}"]
    decodes = ("papo_rl.merge_mode", "pr1_rl.merge_mode", "evaluate.generation.merge_mode")
    return [f"merge_semantics={merge}", *(f"{key}=reprefill" for key in decodes)]


def training_rows(
    model, tok, tags, shape_name: str, seq_len: int, device: torch.device, papo_len: int | None = None,
    merge: str = "isolated",
) -> list[Row]:  # fmt: skip
    """One parallel SFT step on a ``seq_len``-token row and one PAPO update on two ``papo_len``-token
    rollouts (default ``seq_len``), under merge semantics ``merge``, each beside the planner's peak."""
    from components.training import memory
    from components.training.memory_probe import measure
    from components.training.rl_batch import Rollout
    from components.training.sft import SFTSettings, _train_step, build_optimizer, build_scheduler

    w = 4 if next(model.parameters()).dtype == torch.float32 else 2
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    shape = memory.ModelShape.from_hf_config(model.config)
    rows: list[Row] = []
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    settings = SFTSettings(
        mode="parallel", total_steps=1, batch_size=1, lr=1e-6, gradient_checkpointing=True, merge=merge
    )
    example = parallel_example(tok, tags, seq_len)
    # a reread row carries the re-read copies of its branches: the planner's bound, up to one more row
    laid_out = len(example.input_ids) * (2 if merge == "reread" else 1)
    with measure(device) as reading:
        optimizer = build_optimizer(model, settings)
        start = time.perf_counter()
        record = _train_step(
            model,
            optimizer,
            build_scheduler(optimizer, settings),
            [example],
            settings,
            tok.pad_token_id,
            tags,
        )
        if device.type == "cuda":
            torch.cuda.synchronize()
        wall = time.perf_counter() - start
    masters = _optimizer_text(optimizer, model)
    plan = memory.training_state_terms(shape, w) + memory.training_activation_terms(
        shape, memory.ForwardShape(1, laid_out, True), w, True, "parallel_warmup.max_length"
    )
    planned = sum(t.bytes for t in plan) - shape.params * w  # the weights existed before the step
    rows.append((f"parallel-mask SFT step ({shape_name}, {dtype}, {len(example.input_ids)} tokens, {merge})",
                 f"{wall:.2f} s, peak {_fmt_gib(reading.peak_bytes)}", _fmt_gib(planned),
                 f"measured/planned {reading.peak_bytes / planned:.2f}; loss {record['loss']:.2f}; {masters}"))  # fmt: skip
    if hasattr(optimizer, "remove_hooks"):
        optimizer.remove_hooks()
    del optimizer
    model.zero_grad(set_to_none=True)
    gc.collect()  # the fp32 masters and AdamW state go before the PAPO update builds its own
    if device.type == "cuda":
        torch.cuda.empty_cache()
    # one PAPO update on parallel rollouts (the rollout text is the SFT example's layout)
    papo_len = papo_len or seq_len
    first = example if papo_len == seq_len else parallel_example(tok, tags, papo_len)
    other = parallel_example(tok, tags, papo_len, " 2")  # a different response: the advantages do not cancel
    rollouts = [
        Rollout(group_id="g", problem_id="p", answer="1", prompt_ids=list(ex.input_ids[: ex.n_prompt]),
                response_ids=list(ex.input_ids[ex.n_prompt :]), text="", finish_reason="stop",
                parallel_taken=True, reward=r)
        for ex, r in ((first, 1.0), (other, -1.0))
    ]  # fmt: skip
    from components.config import load_config

    cfg = load_config(
        ROOT / "configs" / "tiny.yaml",
        # the rollouts are built, not sampled: no sampler log-probs for PAPO's post-merge IS weights
        overrides=[
            "papo_rl.lr=1e-7",
            "papo_rl.micro_batch_size=1",
            "papo_rl.rollout_correction.post_merge_is=false",
            *_semantics_overrides(merge),
        ],
        root=ROOT,  # the prompts live in the checkout
    )
    if _verl_importable():
        from components.training.job import rl_job  # lazy: the node's environment (torch, verl)
        from components.training.rl import RLTrainer

        problems = [{"id": "p", "problem": "x", "answer": "1"}]
        with measure(device) as reading:
            work = Path(tempfile.mkdtemp(prefix="npr-smoke-rl-"))
            trainer = RLTrainer(rl_job("papo_rl", cfg), model, tok, problems, problems, work)
            start = time.perf_counter()
            stats = trainer._update([rollouts], collections.Counter())
            if device.type == "cuda":
                torch.cuda.synchronize()
            wall = time.perf_counter() - start
        how = f"RLTrainer._update with verl's PAPO loss; {_optimizer_text(trainer.optimizer, model)}"
        if hasattr(trainer.optimizer, "remove_hooks"):
            trainer.optimizer.remove_hooks()
        del trainer
    else:
        with measure(device) as reading:
            start = time.perf_counter()
            stats, opt_name = _papo_update_without_verl(model, rollouts, tok.pad_token_id, tags, cfg)
            if device.type == "cuda":
                torch.cuda.synchronize()
            wall = time.perf_counter() - start
        how = f"verl absent: the trainer's batch, log-probs and {opt_name}, on-policy surrogate loss"
    response = len(rollouts[0].response_ids)
    fwd = memory.ForwardShape(1, len(first.input_ids) + (response if merge == "reread" else 0), True, scored=response)
    plan = memory.training_state_terms(shape, w) + memory.training_activation_terms(
        shape, fwd, w, True, "papo_rl.max_new_tokens"
    )
    planned = sum(t.bytes for t in plan) - shape.params * w
    rows.append((f"PAPO update ({shape_name}, {dtype}, 2 rollouts x {len(first.input_ids)} tokens, {merge})",
                 f"{wall:.2f} s, peak {_fmt_gib(reading.peak_bytes)}", _fmt_gib(planned),
                 f"measured/planned {reading.peak_bytes / planned:.2f}; grad norm {stats['actor/grad_norm']:.3g}; {how}"))  # fmt: skip
    model.zero_grad(set_to_none=True)
    return rows


# The GPU run measures at the one-GPU profile's shapes (``profile_sizes``): its model, its parallel SFT row
# (parallel_warmup.max_length) and its PAPO rollout (papo_rl's prompt bound + max_new_tokens), under its
# merge semantics. New tokens, batch: (merge check), (decode at batch 1), (decode at batch 64).
PROFILE = "qwen3-1.7b-1gpu"
GPU_DECODE = dict(merge=(8, 512), decode=((1, 1024), (64, 512)))
CPU_SIZES = dict(merge=(4, 96), decode=((1, 256), (64, 128)), seq=512, papo_seq=512, merge_semantics="isolated")


def profile_sizes(profile: str = PROFILE) -> tuple[dict, dict, str]:
    """The model shape, the sizes and a name of ``profile``'s GPU work (read from configs/, overlays
    resolved): what the GPU rows measure, so the table compares the planner at the profile's real shapes."""
    from components.config import read_profile, validate_config  # lazy: --cpu runs need no profile

    cfg = validate_config(read_profile(profile, ROOT / "configs"), profile)
    arch = cfg.models.architecture
    if arch is None:
        raise SystemExit(f"profile {profile} declares no models.architecture: no GPU shapes to measure")
    shape = dict(hidden=arch.hidden_size, intermediate=arch.intermediate_size, layers=arch.num_hidden_layers,
                 heads=arch.num_attention_heads, kv_heads=arch.num_key_value_heads, head_dim=arch.head_dim,
                 vocab=arch.vocab_size)  # fmt: skip
    papo = cfg.papo_rl
    sizes = dict(
        GPU_DECODE,
        seq=cfg.parallel_warmup.max_length,
        papo_seq=papo.verl.max_prompt_length + papo.max_new_tokens,
        merge_semantics=cfg.merge_semantics,
    )
    return shape, sizes, f"{cfg.models.base_model} shape ({profile})"


def shaped_model_rows(
    device: torch.device,
    cpu: bool,
    emit=lambda rows: None,
    dtype: str | None = None,
    over_budget=lambda: False,
    profile: str = PROFILE,
) -> list[Row]:
    from components.models.tags import add_tag_tokens
    from components.models.tiny import tiny_test_world
    from components.structure import TagIds

    shape, sizes, name = (SMALL, CPU_SIZES, "small Qwen3") if cpu else profile_sizes(profile)
    dtype = getattr(torch, dtype or ("float32" if cpu else "bfloat16"))
    _, tok = tiny_test_world(seed=0)  # a tokenizer with the NPR tags; the model's vocabulary is larger
    model = build_model(shape, device, dtype)
    add_tag_tokens(model, tok, "npr")
    tags = TagIds.from_tokenizer(tok, "npr")
    rows = [
        (f"{name}: parameters", f"{sum(p.numel() for p in model.parameters()) / 1e9:.3f} B", "",
         f"{str(dtype).removeprefix('torch.')}, random init; {shape}")
    ]  # fmt: skip
    model.eval()
    rows += exact_merge_rows(model, tok, tags, *sizes["merge"])
    emit(rows)
    model.train()
    try:
        rows += training_rows(
            model, tok, tags, name, sizes["seq"], device, sizes["papo_seq"], sizes["merge_semantics"]
        )
    except torch.OutOfMemoryError as err:  # the table so far still prints, with the planner's view of it
        rows.append((f"SFT step / PAPO update ({name}, {sizes['seq']} tokens)", "out of memory", "",
                     str(err).splitlines()[0][:300]))  # fmt: skip
    emit(rows)
    model.gradient_checkpointing_disable()
    model.eval()
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    for batch, new_tokens in sizes["decode"]:
        if over_budget():
            rows.append((f"decode, batch {batch} x {new_tokens} new tokens", "skipped", "", "--budget-s used up"))
            continue
        rows += decode_rows(model, tok, tags, new_tokens, batch)
        emit(rows)
    return rows


def table_text(rows: list[Row], device: str) -> str:
    lines = [f"device: {device}", "", "| what | measured | planner | note |", "|---|---|---|---|"]
    lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="run on CPU with small shapes")
    parser.add_argument(
        "--dtype",
        choices=("float32", "bfloat16"),
        help="the shaped model's weights (default bfloat16 on a GPU, float32 with --cpu)",
    )
    parser.add_argument(
        "--budget-s",
        type=float,
        default=360.0,
        help="seconds after which the remaining decode rows are skipped (default 360: the node allows 8 min)",
    )
    parser.add_argument("--out", type=Path, help="also write the table (markdown) and rows (json) here")
    parser.add_argument(
        "--profile",
        default=PROFILE,
        help=f"the profile whose model and sequence shapes the GPU rows measure (default {PROFILE})",
    )
    parser.add_argument(
        "--stages",
        default="",
        help="part 1: the first stages of the tiny chain to run, comma-separated (a prefix of "
        "dvc.yaml's NPR branch to papo_rl, then evaluate; default none: they need the project's whole "
        "environment)",
    )
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("WANDB_MODE", "offline")
    os.environ.setdefault("WANDB_SILENT", "true")
    if args.cpu:
        device = torch.device("cpu")
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    elif torch.cuda.is_available():
        device = torch.device("cuda", 0)
    else:
        parser.error("no CUDA device: run with --cpu")
    stages = [x for x in args.stages.split(",") if x]
    if stages and stages != tiny_chain()[: len(stages)]:
        parser.error(f"--stages must be a prefix of {','.join(tiny_chain())}")
    started = time.perf_counter()
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    name += f"; torch {torch.__version__}, python {sys.version.split()[0]}"

    def emit(rows: list[Row], final: bool = False) -> str:
        """Write the rows so far to --out (a run cut short by a time limit still leaves its table)."""
        label = "total wall time" if final else "wall time so far"
        rows = [*rows, (label, f"{time.perf_counter() - started:.0f} s", "", "")]
        text = table_text(rows, name)
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "smoke.md").write_text(text + "\n")
            (args.out / "smoke.json").write_text(json.dumps([list(r) for r in rows], indent=1))
        if not final:
            print(f"[{time.perf_counter() - started:.0f} s] {rows[-2][0]}: {rows[-2][1]}", flush=True)
        return text

    rows: list[Row] = []
    if stages:
        rows += run_tiny_stages(device, args.cpu, stages)
        emit(rows)
    rows += shaped_model_rows(
        device, args.cpu, emit, args.dtype, lambda: time.perf_counter() - started > args.budget_s, args.profile
    )
    print(emit(rows, final=True))
    with contextlib.suppress(Exception):
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
