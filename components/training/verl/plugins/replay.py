"""verl's sync replay buffer with the local trainer's two bounds: refilled groups per step, for every RL stage.

verl 0.9.1's v1 sync ``ReplayBuffer`` (``verl/trainer/ppo/v1/replay_buffer.py``, the sampler the trainer
asks for each step's groups) differs from the local trainer's step in two places that a real run hits:

- **Groups the structural filter emptied.** The ``npr_parallel`` agent loop drops a training rollout the
  structural filter rejects (it returns no output). A group whose every rollout was dropped is *finished*
  with no trajectories; verl treats it as sampleable, and when a step's groups are all empty it raises
  "Sync replay buffer selected terminal groups with no materializable trajectories". Its own switch
  ``trainer.v1.sampler.sync_refill_failed_groups`` replaces only *failed* groups (a session raised). Here an
  emptied training group counts as failed: verl's refill path evicts it and submits a fresh prompt. Groups
  that keep some trajectories are trained as verl trains them. At most ``max_emptied_groups`` groups are
  replaced a step, failed ones (verl's own refill of groups whose sessions raised, which is otherwise
  unbounded too: an agent loop that fails on every sample refilled forever) included (``<stage>.verl.max_refill_batches`` x prompts per step); past it the step fails with a
  message naming the structural filter, instead of sampling forever from a policy that no longer writes
  its schema.
- **DAPO's dynamic sampling.** verl's v1 buffer evicts every group whose rewards are all equal and refills
  until the batch is full, with no cap: ``algorithm.filter_groups.max_num_gen_batches`` "is ignored by the
  built-in V1 ReplayBuffer" (its own warning). A step whose rollouts all score alike (a policy that is
  always truncated, say) then samples forever; measured here, a tiny ``sr_rl`` job ran 1.5 hours in its first
  step. The local trainer stops after ``max_gen_batches`` generation batches and trains on what it has. Here
  at most ``(max_gen_batches - 1) x prompts_per_step`` groups are evicted a step; after that, equal-reward
  groups stay in the batch (their advantage is zero, so they add no gradient). ``max_gen_batches <= 0``
  keeps verl's unbounded refills (verl's convention).

The launcher names this class as ``trainer.v1.sampler.custom_sampler`` for every verl RL stage and passes
the bounds in ``sampler_kwargs``. verl hands a custom sampler only its base arguments, so the DAPO metric,
the batch size and exact single-prompt refills are set here from the same kwargs (the launcher also sets
``sync_refill_failed_groups``, which makes the trainer fetch single prompts for exact refills).
Validation groups are never evicted (the agent loop keeps held-out traces; verl never filters ``val``).
"""

from __future__ import annotations

import logging
import os
from typing import Any

from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer

from components.training.verl.plugin_names import REPLAY_SAMPLER

logger = logging.getLogger(__name__)
logger.setLevel(os.getenv("VERL_LOGGING_LEVEL", "WARN"))

SAMPLER_NAME = REPLAY_SAMPLER


class StructuralFilterExhausted(RuntimeError):
    """Every rollout of too many refilled groups was dropped by the structural filter."""


class BoundedReplayBuffer(ReplayBuffer):
    """verl's sync replay buffer with bounded refills of emptied and equal-reward groups (module docstring).

    ``sampler_kwargs``: ``max_emptied_groups`` (0: the stage has no structural filter, an emptied group is
    an error as in verl), ``dapo_metric`` (verl's ``filter_groups.metric``, or null without dynamic
    sampling), ``max_dapo_evictions`` (null: unbounded), ``train_batch_size`` (prompts per step).
    """

    def __init__(self, *args: Any, sampler_kwargs: Any = None, **kwargs: Any) -> None:
        options = dict(sampler_kwargs or {})
        self.max_emptied_groups = int(options.get("max_emptied_groups") or 0)
        bound = options.get("max_dapo_evictions")
        self.max_dapo_evictions = None if bound is None else int(bound)
        metric = options.get("dapo_metric")
        kwargs.setdefault("sync_refill_failed_groups", self.max_emptied_groups > 0)
        kwargs.setdefault("filter_groups_metric", metric)
        kwargs.setdefault("train_batch_size", options.get("train_batch_size"))
        if metric is not None or self.max_emptied_groups > 0:
            kwargs.setdefault("gen_batch_size", 1)  # exact refills (verl requires it with refills)
        super().__init__(*args, sampler_kwargs=sampler_kwargs, **kwargs)
        self.emptied_by_step: dict[int, set[str]] = {}
        self.failed_by_step: dict[int, set[str]] = {}
        self.dapo_evicted_by_step: dict[int, set[str]] = {}
        self._step = 0

    def _terminal_eviction_reasons(self, global_steps: int, partition_id: str):
        self._step = global_steps
        stale, dapo, failed, dapo_counts = super()._terminal_eviction_reasons(global_steps, partition_id)
        if partition_id == "val" or self.max_emptied_groups <= 0:
            return stale, dapo, failed, dapo_counts
        materializable = {key.split("_")[0] for key in self.partitions[partition_id]}
        emptied = self.finished_keys[partition_id] - materializable
        replaced = emptied | failed  # failed: a session raised (verl's own refill), counted in the same bound
        if replaced:
            seen = self.emptied_by_step.setdefault(global_steps, set())
            seen |= replaced
            failures = self.failed_by_step.setdefault(global_steps, set())
            failures |= failed
            if len(seen) > self.max_emptied_groups:
                cause = (
                    f"{len(failures)} of them failed (an agent-loop error: see the driver log's 'Error in "
                    "_run_prompt')"
                    if failures
                    else "the policy no longer writes its parallel schema"
                )
                raise StructuralFilterExhausted(
                    f"step {global_steps}: {len(seen)} groups were replaced (every rollout dropped by the "
                    f"structural filter, or failed), more than the {self.max_emptied_groups} refills allowed a "
                    f"step (<stage>.verl.max_refill_batches x prompts_per_step); {cause}"
                )
            logger.info("step %d: refilling %d emptied and %d failed groups", global_steps, len(emptied), len(failed))
        return stale, dapo, failed | emptied, dapo_counts

    def _dapo_filtered_keys(self, partition_id: str):
        uids, counts = super()._dapo_filtered_keys(partition_id)
        if partition_id == "val" or self.max_dapo_evictions is None or not uids:
            return uids, counts
        evicted = self.dapo_evicted_by_step.setdefault(self._step, set())
        room = self.max_dapo_evictions - len(evicted)
        if room <= 0:  # the step's generation budget is spent: equal-reward groups stay, with zero advantage
            return set(), counts.__class__()
        allowed = set(sorted(uids)[:room])
        evicted |= allowed
        kept_scores = {}
        for uid in allowed:  # the breakdown of what was evicted, for verl's metrics
            value = self._dapo_classification_cache[partition_id].get(uid)
            kept_scores[value] = kept_scores.get(value, 0) + 1
        return allowed, counts.__class__(kept_scores)


__all__ = ["SAMPLER_NAME", "BoundedReplayBuffer", "StructuralFilterExhausted"]
