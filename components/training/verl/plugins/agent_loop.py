"""Native fork/merge rollouts inside verl: the agent loop ``npr_parallel`` (``rollout.agent.default_agent_loop``).

verl's default ``single_turn_agent`` makes one sequential ``generate`` call per sample, which is PAPO on
sequential traces (the paper's ablation). ``NPRParallelAgentLoop`` runs the project's fork/merge controller
(``components.engine.SequenceController``, the one that decides forks, refusals, budgets and positions for
every backend) through the async driver (``components.engine.drive``) against verl's
``server_manager.generate``:

- one ``request_id`` per sample for all its requests, so verl's sticky routing sends a sample's branches
  and its merge to the replica whose radix cache holds their prefix (verl still gives each call a fresh
  server-side id);
- the branches of a block are concurrent requests sharing the prefix (exact: same context and positions
  as the trainer's); the merge is a request whose prompt is prefix + all branches, re-prefilled, so the
  tokens after it are corrected by the NPR actor (``papo.post_merge_is_weights``);
- forced tokens (``<step>`` + label, ``<takeaway>``) sit in the prompt of their request, so the server
  returns no log-prob for them: their ``response_logprobs`` are NaN (weight 1, left out of the mismatch
  metrics); every other token carries the server's log-prob;
- ``response_mask`` is 1 on every response token, forced ones included: the same rule as the local
  trainer (``rl_batch.response_mask_of``), which trains the layout tokens too, so a PAPO checkpoint keeps
  writing the format when it is decoded without the engine (sequential visibility, refused forks);
- the reward is set here (``reward_score``, so verl's reward loop is skipped for these samples): the
  stage's reward (stage3; Parallel-R1's accuracy rewards, with the sample's ``global_steps`` for the
  alternating one) from ``components/grading/verl_reward.py:compute_score`` on the response text
  with its tags, plus DAPO's overlong penalty when configured, exactly as the local trainer scores;
- the structural filter: a training trace the canonical mask builder rejects (``rl_batch.
  structural_rejection``; also a block of two or more steps the engine did not fork, ``unforked_steps``),
  one the reward marks filtered, or an empty one is dropped (``[]``) and counted by reason's category
  (``NPRParallelAgentLoop.filter_counts``, logged). Validation traces (``extra_info.held_out``,
  set by the launcher for the rows of verl's validation set) are never dropped: a malformed answer counts as one in the held-out metrics.

The settings of the controller are the local trainer's rollout settings (``RLTrainer._gen_cfg``):
parallel mode, the rollout's temperature / top-p / top-k, the recipe's engine settings the launcher puts in
each row (``extra_info["generation"]``: Parallel-R1's paths per block), ``max_new_tokens`` =
``rollout.response_length`` minus one (the stop token is a response token in verl; the launcher sets the response length to the stage's
``max_new_tokens`` + 1), no step repetition penalty, default branch limits.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import time
from collections import Counter
from typing import Any, ClassVar
from uuid import uuid4

import hydra.utils
import torch
from verl.experimental.agent_loop.agent_loop import (
    AgentLoopBase,
    AgentLoopMetrics,
    AgentLoopOutput,
    _agent_loop_registry,
    register,
)

from components.engine import DecodePolicy, GenerationConfig, SamplingSettings, SequenceController, drive
from components.grading.verl_reward import compute_score
from components.structure import TagIds
from components.training.dapo import overlong_penalty
from components.training.rl_batch import Rollout, structural_rejection
from components.training.verl.plugin_names import AGENT_LOOP, DEFAULT_SCHEMA, SCHEMA_ENV
from components.training.verl.plugins.rollout_log import log_rollout

logger = logging.getLogger(__name__)
logger.setLevel(os.getenv("VERL_LOGGING_LEVEL", "WARN"))

BACKEND = "verl"


def registered_agent_loop(name: str) -> type:
    """The class verl's ``AgentLoopWorker`` instantiates for ``name`` (KeyError if none is registered)."""
    # verl's own loops are registered already: importing verl.experimental.agent_loop.agent_loop above runs
    # the package's __init__, which imports them
    if name not in _agent_loop_registry:
        raise KeyError(f"no agent loop {name!r}; registered: {sorted(_agent_loop_registry)}")
    return hydra.utils.get_class(_agent_loop_registry[name]["_target_"])


def sample_seed(*parts: Any) -> int:
    """A 31-bit sampling seed from a sample's identity (prompt uid, session, step): reproducible rollouts."""
    digest = hashlib.sha256("|".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


def _plain(value: Any) -> Any:
    """A parquet round trip leaves numpy scalars/arrays and nested dicts in dataset fields."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


@register(AGENT_LOOP)
class NPRParallelAgentLoop(AgentLoopBase):
    """Native-parallel rollouts with the structural filter and the Stage-3 reward (module docstring)."""

    # rollouts dropped per reason in this worker process (verl has no channel for dropped samples)
    filter_counts: ClassVar[Counter] = Counter()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.response_length = int(self.rollout_config.response_length)
        if self.response_length < 2:
            raise ValueError("rollout.response_length must leave room for a response and its stop token")
        self.tags = TagIds.from_tokenizer(self.tokenizer, os.environ.get(SCHEMA_ENV, DEFAULT_SCHEMA))
        reward_kwargs = self.config.get("reward", {}).get("reward_kwargs", {}) or {}
        self.overlong = reward_kwargs.get("overlong_buffer_cfg") or {}
        self.max_resp_len = reward_kwargs.get("max_resp_len") or self.response_length

    def generation_config(
        self, sampling_params: dict[str, Any], seed: int, engine: dict[str, Any] | None = None
    ) -> GenerationConfig:
        """The controller's settings: the local trainer's rollout settings (module docstring), plus the
        recipe's engine settings from the row (``extra_info["generation"]``: Parallel-R1's paths per block
        and path cap)."""
        return GenerationConfig(
            mode="parallel",
            temperature=float(sampling_params.get("temperature", 1.0)),
            top_p=float(sampling_params.get("top_p", 1.0)),
            top_k=int(sampling_params.get("top_k", -1)),
            max_new_tokens=self.response_length - 1,
            step_repetition_penalty=1.0,
            seed=seed,
            **(engine or {}),
        )

    async def run(
        self, sampling_params: dict[str, Any], **kwargs: Any
    ) -> AgentLoopOutput | list[AgentLoopOutput]:
        messages = list(kwargs["raw_prompt"])
        extra_info = _plain(kwargs.get("extra_info") or {})
        validating = bool(extra_info.get("held_out"))
        prompt_ids = await self.ct_build_initial_tokens(messages)
        # the sample's identity, never verl's uid (a fresh uuid4 per prompt and run): the rollout seed, the
        # problem, the sample within its group, the training step; so rollouts repeat run to run, and a
        # resumed job draws what the interrupted one would have
        seed = sample_seed(
            self.rollout_config.get("seed"),
            extra_info.get("id", extra_info.get("index")),
            kwargs.get("session_id"),
            kwargs.get("global_steps"),
            validating,
        )
        gen_cfg = self.generation_config(sampling_params, seed, extra_info.get("generation"))
        policy = DecodePolicy.from_config(gen_cfg, self.tokenizer, self.tags)
        controller = SequenceController(prompt_ids, policy, seed=seed)
        request_id = uuid4().hex  # one per sample: sticky routing keeps its prefix cache on one replica
        versions: list[int] = []  # the weight versions (global steps) the sample's requests were served with

        async def generate(prompt: list[int], params: dict[str, Any]) -> Any:
            output = await self.server_manager.generate(
                request_id=request_id, prompt_ids=prompt, sampling_params={**params, "logprobs": True}
            )
            versions.extend(weight_versions(output))
            return output

        start = time.perf_counter()
        await drive(controller, generate, SamplingSettings.from_config(gen_cfg))
        wall = time.perf_counter() - start
        gen = controller.generation(backend=BACKEND, merge_mode="reprefill", wall_time_s=wall)
        stop = [gen.stop_token_id] if gen.stop_token_id is not None else []
        response_ids = list(gen.token_ids) + stop
        logprobs = list(gen.logprobs) + ([gen.stop_logprob] if stop else [])

        score_start = time.perf_counter()
        # scheduled rewards (Parallel-R1's alternating one) read the training step
        score_info = dict(extra_info)
        if kwargs.get("global_steps") is not None:
            score_info["global_step"] = int(_plain(kwargs["global_steps"]))
        result = await self.loop.run_in_executor(
            None,
            lambda: _compute_score(
                kwargs.get("data_source"), gen.text, _plain(kwargs.get("reward_model") or {}), score_info
            ),
        )
        reward = float(result["score"])
        if self.overlong and self.overlong.get("enable") and response_ids:
            reward += float(
                overlong_penalty(
                    torch.tensor([len(response_ids)]),
                    int(self.max_resp_len),
                    int(self.overlong["len"]),
                    float(self.overlong.get("penalty_factor", 1.0)),
                )[0]
            )
        score_time = time.perf_counter() - score_start

        rejection = self._rejection(
            prompt_ids, response_ids, gen.text, result, tuple(b.start for b in gen.blocks)
        )
        log_rollout(
            {
                "step": None if kwargs.get("global_steps") is None else int(_plain(kwargs["global_steps"])),
                "held_out": validating,
                "valid": bool(result.get("valid", False)),
                "correct": bool(result.get("acc", 0.0)),
                "parallel": bool(result.get("parallel", 0.0)),
                "forked": bool(gen.parallel_taken),
                "rejected": None if validating else rejection,
                "tokens": len(response_ids),
            }
        )
        if rejection is not None and not validating:
            self.filter_counts["rejected"] += 1
            self.filter_counts[f"rejected/{rejection}"] += 1
            logger.info(
                "npr_parallel drops a rollout (%s); dropped so far: %s", rejection, dict(self.filter_counts)
            )
            return []
        self.filter_counts["kept"] += 1

        reward_extra_info = {
            **{k: v for k, v in result.items() if isinstance(v, int | float | bool | str)},
            "parallel_taken": gen.parallel_taken,
            "fork_refusals": len(gen.fork_refusals),
            "branches": sum(b.n_branches for b in gen.blocks),
            "unscored_forced_tokens": sum(1 for lp in logprobs if not math.isfinite(lp)),
            "structurally_rejected": rejection is not None,
        }
        return AgentLoopOutput(
            prompt_ids=prompt_ids,
            response_ids=response_ids,
            response_mask=[1] * len(response_ids),
            response_logprobs=logprobs,
            reward_score=reward,
            num_turns=2,
            metrics=AgentLoopMetrics(generate_sequences=wall, compute_score=score_time),
            extra_fields={
                "reward_extra_info": reward_extra_info,
                "turn_scores": [],
                "tool_rewards": [],
                "npr_structure": gen.structure(),
                # verl's own loops pass these through from the server's answers; its metrics step reads
                # them for every sample (trajectory spans and staleness) and fails without them
                **version_span(versions),
            },
        )

    def _rejection(
        self,
        prompt_ids: list[int],
        response_ids: list[int],
        text: str,
        result: dict,
        forked_at: tuple[int, ...],
    ) -> str | None:
        """Why the structural filter drops this trace (the local trainer's rule), or None. ``forked_at``:
        where the engine forked (a block of two or more steps it did not fork is dropped: the actor lays
        every block out as branches)."""
        if not response_ids:
            return "empty_response"
        rollout = Rollout(
            "", "", "", list(prompt_ids), list(response_ids), text, "", False, forked_at=forked_at
        )
        reason = structural_rejection(rollout, self.tags)
        if reason is None and result.get("filtered"):
            reason = "reward_filtered"
        return reason


def weight_versions(output: Any) -> list[int]:
    """The weight versions (global steps) a server answer reports: verl's ``LLMServerClient`` sets
    ``min_global_steps``/``max_global_steps`` in ``extra_fields`` from the server's ``global_steps``."""
    extra = getattr(output, "extra_fields", None) or {}
    return [int(extra[k]) for k in ("min_global_steps", "max_global_steps") if extra.get(k) is not None]


def version_span(versions: list[int]) -> dict[str, int | None]:
    """``min_global_steps``/``max_global_steps`` of a sample whose requests reported ``versions`` (verl's
    tool agent loop keeps the first request's min and the last one's max; one sample's requests may
    span a weight update only in verl's asynchronous trainers)."""
    if not versions:
        return {"min_global_steps": None, "max_global_steps": None}
    return {"min_global_steps": min(versions), "max_global_steps": max(versions)}


def _compute_score(
    data_source: Any, text: str, reward_model: dict[str, Any], extra_info: dict[str, Any]
) -> dict:
    """The stage's reward for one response (``extra_info`` carries reward, values, grading, schema)."""
    return compute_score(data_source, text, reward_model.get("ground_truth"), extra_info=extra_info)
