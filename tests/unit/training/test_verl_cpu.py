"""verl on CPU, piece by piece, with verl's own classes: the cpu platform, the engine keys, the torch
rollout server and its weight sync, the agent loop's weight-version fields, PAPO's advantage on verl's
padded batches. The whole job runs in tests/integration/training/test_verl_main_ppo.py."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

import components.training.verl.plugins  # noqa: F401  (registers the plugins, as VERL_USE_EXTERNAL_MODULES does)
from components.models.loading import save_model
from components.models.tiny import tiny_test_world

REPO = Path(__file__).resolve().parents[3]


def test_the_cpu_platform_is_chosen_only_by_name(monkeypatch) -> None:
    from verl.plugin.platform.platform_manager import (
        PlatformRegistry,
        _create_platform,
        _detect_platform_name,
    )

    monkeypatch.delenv("VERL_PLATFORM", raising=False)
    assert "cpu" in PlatformRegistry.registered_names()
    assert _detect_platform_name() != "cpu"  # auto-detection is unchanged (a GPU node stays nvidia)
    monkeypatch.setenv("VERL_PLATFORM", "cpu")
    platform = _create_platform(_detect_platform_name())
    assert (platform.device_name, platform.communication_backend_name(), platform.ray_resource_name()) == (
        "cpu",
        "gloo",
        "GPU",  # a logical device slot per rank: what verl's resource check counts
    )
    module = platform.device_module
    module.empty_cache()
    module.synchronize()
    free, total = module.mem_get_info()
    assert 0 < free <= total and module.memory_allocated() > 0
    state = module.get_rng_state()
    first = torch.rand(3)
    module.set_rng_state(state)
    assert torch.equal(torch.rand(3), first)
    assert torch.zeros(2).to(platform.current_device()).device.type == "cpu"


def test_verls_process_group_setup_runs_on_the_cpu_platform() -> None:
    """verl joins `cpu:gloo,<device>:<backend>`, which torch refuses on CPU ("Duplicate device type cpu");
    with the platform plugin loaded the same verl function brings up a gloo group."""
    script = textwrap.dedent(
        """
        import os, torch
        os.environ.update(VERL_PLATFORM="cpu", RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1")
        import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); os.environ["MASTER_PORT"] = str(s.getsockname()[1]); s.close()
        import components.training.verl.plugins  # noqa
        from verl.workers import engine_workers
        engine_workers.initialize_global_process_group_ray(timeout_second=None)
        t = torch.ones(2); torch.distributed.all_reduce(t)
        print(torch.distributed.get_backend(), t.tolist())
        """
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "gloo [1.0, 1.0]"


def test_the_actors_are_registered_under_the_cpu_device_key(monkeypatch) -> None:
    from verl.workers.engine.base import EngineRegistry
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead

    from components.training.verl.plugins.engine import NPRParallelEngine

    monkeypatch.setenv("VERL_PLATFORM", "cpu")
    monkeypatch.setenv("VERL_ENGINE_DEVICE", "cpu")
    monkeypatch.delenv("VERL_ENGINE_VENDOR", raising=False)
    assert EngineRegistry.get_engine_cls("language_model", "fsdp2") is FSDPEngineWithLMHead
    monkeypatch.setenv("VERL_ENGINE_VENDOR", "npr")
    assert EngineRegistry.get_engine_cls("language_model", "fsdp2") is NPRParallelEngine


def test_torch_is_a_rollout_in_both_of_verls_registries() -> None:
    from verl.workers.rollout.base import get_rollout_class
    from verl.workers.rollout.replica import get_rollout_replica_class

    from components.training.verl.plugins.torch_rollout import TorchReplica, TorchServerAdapter

    assert get_rollout_replica_class("torch") is TorchReplica
    assert get_rollout_class("torch", "async") is TorchServerAdapter


def test_vllm_server_is_a_rollout_in_both_of_verls_registries_beside_torch() -> None:
    from verl.workers.rollout.base import get_rollout_class
    from verl.workers.rollout.replica import get_rollout_replica_class

    from components.training.verl.plugins.torch_rollout import TorchServerAdapter
    from components.training.verl.plugins.vllm_rollout import VLLMRolloutServer, VLLMServerReplica

    assert get_rollout_replica_class("vllm_server") is VLLMServerReplica
    assert VLLMServerReplica.server_class is VLLMRolloutServer
    # the trainer side is the torch rollout's: it hands the full weights to the replica's server actor
    assert get_rollout_class("vllm_server", "async") is TorchServerAdapter


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from verl.workers.rollout.replica import RolloutMode

    from components.training.verl.plugins.torch_rollout import TorchRolloutServer

    model, tok = tiny_test_world(seed=0)
    path = save_model(model, tok, tmp_path_factory.mktemp("rollout") / "model")
    config = OmegaConf.create(
        {"_target_": "verl.workers.config.RolloutConfig", "name": "torch", "prompt_length": 64, "response_length": 16}
    )
    model_config = OmegaConf.create({"_target_": "verl.workers.config.HFModelConfig", "path": str(path)})
    return TorchRolloutServer(config, model_config, RolloutMode.HYBRID, replica_rank=0), model


SAMPLING = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": True}


def _generate(server, n: int, prompt=(30, 40, 50), **params):
    async def run():
        return await asyncio.gather(
            *[server.generate(list(prompt), {**SAMPLING, **params}, request_id=str(i)) for i in range(n)]
        )

    return asyncio.run(run())


def test_the_torch_server_batches_concurrent_requests_and_answers_like_sglangs(server) -> None:
    srv, _ = server
    before = srv.stats()
    outs = _generate(srv, 6)
    after = srv.stats()
    assert after["requests"] - before["requests"] == 6 and after["batches"] - before["batches"] == 1
    for out in outs:  # verl's TokenOutput, with the weight version verl's metrics read
        assert len(out.token_ids) == len(out.log_probs) <= 16 and out.stop_reason in ("stop", "length")
        assert "global_steps" in out.extra_fields
    # SGLang's budget rule: a request's max_new_tokens, else the response length, within the context
    assert all(len(o.token_ids) <= 5 for o in _generate(srv, 2, max_new_tokens=5))


def test_unseeded_requests_repeat_run_to_run_as_a_multiset(server) -> None:
    """verl's single-turn loop sends no seed: the server derives one from the weight version, the prompt and
    how often it was asked, so a step's group of samples repeats whatever the order of arrival."""
    srv, _ = server
    asyncio.run(srv.set_global_steps(5))
    srv._asked.clear()
    first = sorted(tuple(o.token_ids) for o in _generate(srv, 4))
    srv._asked.clear()  # a new run (or a resumed job) at the same weight version
    again = sorted(tuple(o.token_ids) for o in _generate(srv, 4))
    assert first == again and len(set(first)) > 1  # the same draws, and distinct samples in the group


def test_the_server_samples_the_weights_the_trainer_sent(server) -> None:
    srv, model = server
    state = {k: v.clone() for k, v in model.state_dict().items()}
    state["model.norm.weight"] = state["model.norm.weight"] * 0  # a policy that can only emit one logit row
    version = asyncio.run(srv.update_weights(state, global_steps=7))
    assert version == srv.stats()["weight_version"] and srv.stats()["global_steps"] == 7
    assert torch.equal(srv.model.state_dict()["model.norm.weight"], state["model.norm.weight"])
    assert all(o.extra_fields["global_steps"] == 7 for o in _generate(srv, 2))
    with pytest.raises(KeyError, match="does not have"):
        asyncio.run(srv.update_weights({"no.such.weight": torch.zeros(1)}))


def test_a_samples_weight_versions_reach_verls_metrics_fields() -> None:
    """verl's own loops pass the server's min/max_global_steps through extra_fields; verl's metrics step reads
    them for every sample. The npr_parallel loop spans every request of its sample."""
    from verl.workers.rollout.replica import TokenOutput

    from components.training.verl.plugins.agent_loop import version_span, weight_versions

    answers = [
        TokenOutput(token_ids=[1], extra_fields={"min_global_steps": 3, "max_global_steps": 3}),
        TokenOutput(token_ids=[2], extra_fields={"min_global_steps": 3, "max_global_steps": 4}),
    ]
    versions = [v for a in answers for v in weight_versions(a)]
    assert version_span(versions) == {"min_global_steps": 3, "max_global_steps": 4}


def test_papos_batch_std_leaves_out_verls_padding_rows() -> None:
    """verl pads a batch to its data-parallel multiple with synthetic rows (reward 0, empty response mask;
    verl/trainer/ppo/padding_utils.py); through verl's own advantage step, the real rows' advantages do not
    depend on how many pads the batch got."""
    from verl import DataProto
    from verl.trainer.ppo.padding_utils import construct_minimal_padding_template
    from verl.trainer.ppo.v1.utils import compute_advantage_for_multi_trajectories

    def batch(n_pad: int):
        scores = torch.tensor([1.0, -1.0, 1.0, 1.0, -1.0, -1.0])
        width = 4
        rewards = torch.zeros(len(scores), width)
        rewards[:, -1] = scores
        mask = torch.ones(len(scores), width)
        uids = ["a", "a", "a", "b", "b", "b"]
        source = {"responses": torch.ones(width, dtype=torch.long), "response_mask": torch.ones(width)}
        pad, _ = construct_minimal_padding_template(source, {"seq_len": 8}, eos_token_id=0)
        pad_mask = torch.zeros(1, width)
        pad_mask[0, : pad["response_mask"].numel()] = pad["response_mask"].float()
        rewards = torch.cat([rewards, torch.zeros(n_pad, width)])
        mask = torch.cat([mask, pad_mask.repeat(n_pad, 1)])
        data = DataProto.from_dict(tensors={"token_level_rewards": rewards, "response_mask": mask})
        data.non_tensor_batch["uid"] = np.array(uids + [f"pad{i}" for i in range(n_pad)], dtype=object)
        keys = [f"{u}_{i}_0" for i, u in enumerate(data.non_tensor_batch["uid"])]
        out = compute_advantage_for_multi_trajectories(
            data, batch_keys=keys, adv_estimator="papo", gamma=1.0, lam=1.0, num_repeat=3
        )
        return out.batch["advantages"][: len(scores), -1]

    assert torch.allclose(batch(0), batch(10), atol=1e-6)
    assert torch.all(batch(10)[[0, 2, 3]] > 0) and torch.all(batch(10)[[1, 4, 5]] < 0)
