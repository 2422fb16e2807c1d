"""verl's sync replay buffer for stages with the structural filter: emptied groups are refilled, within a bound.

The ``npr_parallel`` agent loop drops a training rollout the structural filter rejects (it returns no
output). A group whose every rollout was dropped is then *finished* with no trajectories, and verl 0.9.1's
sync ``ReplayBuffer`` (``verl/trainer/ppo/v1/replay_buffer.py``) treats it as sampleable: when a whole step's
groups are empty it raises "Sync replay buffer selected terminal groups with no materializable
trajectories". Its own switch ``trainer.v1.sampler.sync_refill_failed_groups`` replaces only *failed*
groups (a session raised), not emptied ones.

``EmptiedGroupsReplayBuffer`` is that buffer (``trainer.v1.sampler.custom_sampler``) with one change: a
finished training group without trajectories counts as failed, so verl's refill path evicts it and submits
a fresh prompt in its place (the launcher also sets ``sync_refill_failed_groups``, which makes the trainer
fetch single prompts for exact refills). This is the local trainer's rule: an emptied group is dropped and
the step trains on the groups that keep trajectories. Groups with some trajectories left are trained
as verl trains them (missing rollouts padded). Validation groups are never emptied (the agent loop keeps
held-out traces).

The refills of one step are bounded (``max_emptied_groups``, from the stage's ``verl.max_refill_batches``
x prompts per step): past it the step fails with a message naming the structural filter, instead of
sampling forever from a policy that no longer writes the schema.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer

from components.training.verl.plugins.names import REPLAY_SAMPLER

logger = logging.getLogger(__name__)
logger.setLevel(os.getenv("VERL_LOGGING_LEVEL", "WARN"))

SAMPLER_NAME = REPLAY_SAMPLER


class StructuralFilterExhausted(RuntimeError):
    """Every rollout of too many refilled groups was dropped by the structural filter."""


class EmptiedGroupsReplayBuffer(ReplayBuffer):
    """verl's sync replay buffer that refills groups the structural filter emptied (module docstring)."""

    def __init__(self, *args: Any, sampler_kwargs: Any = None, **kwargs: Any) -> None:
        options = dict(sampler_kwargs or {})
        self.max_emptied_groups = int(options.get("max_emptied_groups", 0))
        if self.max_emptied_groups < 1:
            raise ValueError("EmptiedGroupsReplayBuffer needs sampler_kwargs.max_emptied_groups >= 1")
        kwargs.setdefault("sync_refill_failed_groups", True)
        kwargs.setdefault("gen_batch_size", 1)  # exact refills (verl requires it with refills)
        super().__init__(*args, sampler_kwargs=sampler_kwargs, **kwargs)
        self.emptied_by_step: dict[int, set[str]] = {}

    def _terminal_eviction_reasons(self, global_steps: int, partition_id: str):
        stale, dapo, failed, dapo_counts = super()._terminal_eviction_reasons(global_steps, partition_id)
        if partition_id == "val":
            return stale, dapo, failed, dapo_counts
        materializable = {key.split("_")[0] for key in self.partitions[partition_id]}
        emptied = self.finished_keys[partition_id] - materializable
        if emptied:
            seen = self.emptied_by_step.setdefault(global_steps, set())
            seen |= emptied
            if len(seen) > self.max_emptied_groups:
                raise StructuralFilterExhausted(
                    f"step {global_steps}: the structural filter dropped every rollout of {len(seen)} groups "
                    f"(more than the {self.max_emptied_groups} refills allowed a step: "
                    "<stage>.verl.max_refill_batches x prompts_per_step); the policy no longer writes its "
                    "parallel schema"
                )
            logger.info("step %d: refilling %d groups the structural filter emptied", global_steps, len(emptied))
        return stale, dapo, failed | emptied, dapo_counts


__all__ = ["SAMPLER_NAME", "EmptiedGroupsReplayBuffer", "StructuralFilterExhausted"]
