"""The bounded replay buffer against verl's own sync replay buffer, on a real TransferQueue (Ray, local).

Groups are written to TransferQueue as verl's trainer and agent-loop workers write them (a prompt key with
``is_prompt`` and its status, one key per trajectory with its ``rm_scores``); ``refill_fn`` plays the
trainer's ``_add_prompts_to_generate``, writing the groups a refill would produce.
"""

from __future__ import annotations

import itertools

import pytest
import ray
import torch
from omegaconf import OmegaConf

# xdist_group("ray"): the test files that start Ray clusters run on one worker (tests/conftest.py)
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("ray")]

tq = pytest.importorskip("transfer_queue")


@pytest.fixture(scope="module")
def queue():
    ray.init(num_cpus=8, include_dashboard=False, namespace="npr-replay-test", log_to_driver=False)
    tq.init(OmegaConf.create({"backend": {"SimpleStorage": {"num_data_storage_units": 1}}}))
    yield tq
    tq.close()
    ray.shutdown()


_uids = itertools.count()


def _group(scores: list[float] | None, step: int = 1) -> str:
    """A finished group of the train partition: one trajectory per score (None: every rollout dropped)."""
    uid = f"g{next(_uids)}"
    tq.kv_put(key=uid, partition_id="train", tag={"is_prompt": True, "status": "finished", "global_steps": step})
    for i, score in enumerate(scores or []):
        fields = {"rm_scores": torch.tensor([0.0, score])}
        tq.kv_put(
            key=f"{uid}_{i}_0",
            partition_id="train",
            fields=fields,
            tag={"status": "success", "global_steps": step, "min_global_steps": step, "max_global_steps": step},
        )
    return uid


@pytest.fixture(autouse=True)
def _empty_partition(queue):
    yield
    listed = tq.kv_list() or {}
    for partition, items in listed.items():
        if items:
            tq.kv_clear(partition_id=partition, keys=list(items))


def _buffer(cls, refill, **sampler_kwargs):
    return cls(
        trainer_mode="sync",
        trainer_config=OmegaConf.create({}),
        max_off_policy_threshold=None,
        max_off_policy_strategy="drop",
        sampler_kwargs=OmegaConf.create(sampler_kwargs),
        poll_interval=0.05,
        refill_fn=refill,
    )


def test_verls_buffer_fails_a_step_the_structural_filter_emptied(queue) -> None:
    from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer

    _group(None)
    buf = ReplayBuffer(
        trainer_mode="sync",
        trainer_config=OmegaConf.create({}),
        max_off_policy_threshold=None,
        max_off_policy_strategy="drop",
        sampler_kwargs=OmegaConf.create({}),
        poll_interval=0.05,
        refill_fn=lambda n: n,
        sync_refill_failed_groups=True,  # verl's switch refills failed groups only, not emptied ones
        gen_batch_size=1,
    )
    with pytest.raises(RuntimeError, match="no materializable trajectories"):
        buf.sample(global_steps=1, partition_id="train", batch_size=1)


def test_an_emptied_group_is_replaced_by_a_fresh_prompt(queue) -> None:
    from components.training.verl.plugins.replay import BoundedReplayBuffer

    kept = _group([1.0, -1.0])
    emptied = _group(None)
    refills: list[str] = []

    def refill(n: int) -> int:
        refills.extend(_group([0.5, 1.0]) for _ in range(n))
        return n

    buf = _buffer(BoundedReplayBuffer, refill, max_emptied_groups=4, train_batch_size=2)
    meta, metrics = buf.sample(global_steps=1, partition_id="train", batch_size=2)
    groups = {key.split("_")[0] for key in meta.keys}
    assert groups == {kept, refills[0]} and emptied not in groups and len(refills) == 1
    assert metrics["training/rollout_failure/evicted_samples"] == 1


def test_a_policy_that_never_writes_its_schema_fails_the_step_with_a_reason(queue) -> None:
    from components.training.verl.plugins.replay import BoundedReplayBuffer, StructuralFilterExhausted

    _group(None)

    def refill(n: int) -> int:
        for _ in range(n):
            _group(None)
        return n

    buf = _buffer(BoundedReplayBuffer, refill, max_emptied_groups=3, train_batch_size=1)
    with pytest.raises(StructuralFilterExhausted, match="4 groups were replaced"):
        buf.sample(global_steps=1, partition_id="train", batch_size=1)


class _Unbounded(RuntimeError):
    pass


def test_dapo_refills_stop_at_the_generation_budget(queue) -> None:
    """verl's v1 buffer ignores filter_groups.max_num_gen_batches: with every group at one reward it refills
    forever (stopped here after 20 refills). The bounded buffer evicts at most max_dapo_evictions groups a step,
    then keeps equal-reward groups (zero advantage) and the step goes on."""
    from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer

    from components.training.verl.plugins.replay import BoundedReplayBuffer

    calls = {"n": 0}

    def refill(n: int) -> int:
        calls["n"] += 1
        if calls["n"] > 20:
            raise _Unbounded(f"still refilling after {calls['n'] - 1} refills")
        for _ in range(n):
            _group([1.0, 1.0])
        return n

    for _ in range(2):
        _group([1.0, 1.0])
    verl_buf = ReplayBuffer(
        trainer_mode="sync",
        trainer_config=OmegaConf.create({}),
        max_off_policy_threshold=None,
        max_off_policy_strategy="drop",
        sampler_kwargs=OmegaConf.create({}),
        poll_interval=0.05,
        refill_fn=refill,
        filter_groups_metric="reward",
        train_batch_size=2,
        gen_batch_size=1,
        max_inflight_gen_batches=8,
    )
    with pytest.raises(_Unbounded):
        verl_buf.sample(global_steps=1, partition_id="train", batch_size=2)

    _empty = tq.kv_list() or {}
    for partition, items in _empty.items():
        if items:
            tq.kv_clear(partition_id=partition, keys=list(items))
    calls["n"] = 0
    for _ in range(2):
        _group([1.0, 1.0])
    buf = _buffer(BoundedReplayBuffer, refill, dapo_metric="reward", max_dapo_evictions=2, train_batch_size=2)
    meta, metrics = buf.sample(global_steps=1, partition_id="train", batch_size=2)
    assert len({key.split("_")[0] for key in meta.keys}) == 2
    assert metrics["training/filter_groups/evicted_samples"] == 2  # the step's budget, then no more


def test_an_agent_loop_that_fails_every_sample_stops_the_step(queue) -> None:
    """verl refills failed groups (sessions that raised) without a bound; an agent loop failing on every
    sample (a tokenizer without the schema's tags, say) would refill forever. The bound counts them."""
    from components.training.verl.plugins.replay import BoundedReplayBuffer, StructuralFilterExhausted

    def failed_group() -> None:
        uid = f"g{next(_uids)}"
        tq.kv_put(key=uid, partition_id="train", tag={"is_prompt": True, "status": "failure", "global_steps": 1})

    failed_group()

    def refill(n: int) -> int:
        for _ in range(n):
            failed_group()
        return n

    buf = _buffer(BoundedReplayBuffer, refill, max_emptied_groups=3, train_batch_size=1)
    with pytest.raises(StructuralFilterExhausted, match="4 of them failed"):
        buf.sample(global_steps=1, partition_id="train", batch_size=1)
