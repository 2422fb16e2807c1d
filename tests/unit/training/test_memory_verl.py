"""What the planner counts of a verl actor, against verl 0.9.1's own code: its train-mode context switch
driven with a stand-in engine (an FSDP engine built without its CUDA-only ``__init__``), and the pre-run
check against a device report."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from components.config import load_config
from components.training import memory
from components.training.memory import DeviceReport, MemoryPlanError

transformer_impl = pytest.importorskip("verl.workers.engine.fsdp.transformer_impl")
engine_base = pytest.importorskip("verl.workers.engine.base")

GIB = memory.GIB


def _stand_in_engine(param_offload: bool, optimizer_offload: bool):
    """An FSDPEngineWithLMHead over a small module with gradients and AdamW state, made without __init__
    (which needs CUDA): the attributes the mode switch and ``FSDPEngine.to`` read."""
    engine = transformer_impl.FSDPEngineWithLMHead.__new__(transformer_impl.FSDPEngineWithLMHead)
    module = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))
    optimizer = torch.optim.AdamW(module.parameters())
    module(torch.ones(1, 8)).sum().backward()
    optimizer.step()  # AdamW's moments exist
    engine.module, engine.optimizer = module, optimizer
    engine.engine_config = SimpleNamespace(forward_only=False, fsdp_size=1)
    engine._is_offload_param, engine._is_offload_optimizer = param_offload, optimizer_offload
    engine.ulysses_parallel_group = None
    return engine


def _tensor_parts(engine) -> dict[str, set[int]]:
    params = {id(p) for p in engine.module.parameters()}
    grads = {id(p.grad) for p in engine.module.parameters()}
    moments = {id(v) for st in engine.optimizer.state.values() for v in st.values() if torch.is_tensor(v)}
    return {"params": params, "grads": grads, "optimizer": moments}


@pytest.mark.parametrize("param_offload", [True, False])
@pytest.mark.parametrize("optimizer_offload", [True, False])
def test_the_planner_counts_what_verls_train_mode_switch_loads(monkeypatch, param_offload, optimizer_offload):
    engine = _stand_in_engine(param_offload, optimizer_offload)
    parts = _tensor_parts(engine)
    moved: set[str] = set()

    def record_model(module):
        # verl loads the model's flat parameters with their gradients (fsdp_utils.load_fsdp_model_to_gpu)
        assert module is engine.module
        moved.update({"params", "grads"})

    def record_optimizer(optimizer, device):
        tensors = {id(v) for st in optimizer.state.values() for v in st.values() if torch.is_tensor(v)}
        assert tensors == parts["optimizer"]
        moved.add("optimizer")

    # the accelerator's name (a CPU machine says cpu): the switch moves to it on entry, back to cpu on exit
    monkeypatch.setattr(engine_base, "get_device_name", lambda: "cuda")
    monkeypatch.setattr(transformer_impl, "get_device_name", lambda: "cuda")
    monkeypatch.setattr(transformer_impl, "load_fsdp_model_to_gpu", record_model)
    monkeypatch.setattr(transformer_impl, "load_fsdp_optimizer", record_optimizer)
    monkeypatch.setattr(transformer_impl, "offload_fsdp_model_to_cpu", lambda module: None)
    monkeypatch.setattr(transformer_impl, "offload_fsdp_optimizer", lambda optimizer: None)
    with engine.train_mode(zero_grad_on_exit=False):
        assert engine.mode == "train"
        during_update = set(moved)
    assert during_update == memory.verl_train_mode_loads(param_offload, optimizer_offload)
    # the planner's update phase: what was loaded plus what was never offloaded, i.e. all of the fp32 state
    resident = memory.verl_update_resident(param_offload, optimizer_offload)
    assert resident == memory.VERL_ACTOR_STATE
    terms = memory.verl_state_terms(4_000_000_000, 8, resident)
    assert sum(t.bytes for t in terms) == 16 * 4_000_000_000 // 8


def test_the_papo_update_plans_the_fp32_state_verl_loads_and_the_rollout_only_what_stays(in_repo):
    cfg = load_config(profile="qwen3-4b")
    assert cfg.papo_rl.verl.param_offload and cfg.papo_rl.verl.optimizer_offload
    update, rollout = memory.plan_stage("papo_rl", cfg)
    p = memory.model_shape(cfg.models).params
    names = {t.name: t.bytes for t in update.terms}
    assert names["sharded fp32 weights"] == 4 * p // 8  # 1.9 GiB a GPU: the under-count
    assert names["sharded fp32 gradients"] == 4 * p // 8
    assert names["sharded AdamW state"] == 8 * p // 8
    assert not any(t.name.startswith("sharded") for t in rollout.terms)  # offloaded while SGLang samples
    kept = load_config(profile="qwen3-4b", overrides=["papo_rl.verl.optimizer_offload=false"])
    _, rollout = memory.plan_stage("papo_rl", kept)
    assert {t.name for t in rollout.terms if t.name.startswith("sharded")} == {"sharded AdamW state"}


# ------------------------------------------------------------------------------------------ pre-run check
H100 = DeviceReport("NVIDIA H100 80GB HBM3", 81_559 * 2**20, 8)
H200 = DeviceReport("NVIDIA H200", 143_771 * 2**20, 8)


def _io(tmp_path: Path):
    from components.dag import StageIO

    return StageIO("papo_rl", {"parallel_warmup/model": tmp_path / "missing"}, {"model": tmp_path / "m"})


@pytest.mark.parametrize("stage", ["papo_rl", "distill", "parallel_warmup", "evaluate"])
def test_every_gpu_stage_refuses_a_device_that_is_not_the_declared_gpu(in_repo, tmp_path, stage):
    """verl, SGLang and local stages alike: the device report decides, before anything loads."""
    cfg = load_config(profile="qwen3-4b")  # declares 8 x H200
    memory.check_before_run(stage, cfg, _io(tmp_path), read=lambda: H200)
    with pytest.raises(
        MemoryPlanError, match=r"the device is a NVIDIA H100 80GB HBM3, the profile declares H200"
    ):
        memory.check_before_run(stage, cfg, _io(tmp_path), read=lambda: H100)
    with pytest.raises(MemoryPlanError, match=r"2 device\(s\) visible, the stage's job needs 8"):
        memory.check_before_run(
            stage, cfg, _io(tmp_path), read=lambda: DeviceReport(H200.name, H200.total_bytes, 2)
        )


def test_the_plan_is_made_against_the_reported_memory(in_repo, tmp_path):
    cfg = load_config(profile="qwen3-4b-8xh100")
    memory.check_before_run("papo_rl", cfg, _io(tmp_path), read=lambda: H100)
    small = DeviceReport("NVIDIA H100 PCIe", 60 * GIB, 8)  # e.g. a partitioned card: less than declared
    with pytest.raises(MemoryPlanError, match=r"the device has 60.0 GiB, the profile declares 79.6 GiB"):
        memory.check_before_run("papo_rl", cfg, _io(tmp_path), read=lambda: small)
    # a bigger card of the declared name passes, planned against its own memory
    nvl = DeviceReport("NVIDIA H100 NVL", 94 * GIB, 8)
    plans = memory.check_stage("papo_rl", cfg, device=nvl)
    rollout = [p for p in plans if "rollout" in p.phase][0]
    assert rollout.terms[0].bytes == int(94 * GIB * cfg.papo_rl.verl.gpu_memory_utilization)


def test_without_a_visible_gpu_external_stages_plan_against_the_declared_one(in_repo, tmp_path):
    cfg = load_config(profile="qwen3-4b", overrides=["papo_rl.verl.gpu_memory_utilization=0.02"])
    with pytest.raises(MemoryPlanError, match=r"raise papo_rl\.verl\.gpu_memory_utilization"):
        memory.check_before_run("papo_rl", cfg, _io(tmp_path), read=lambda: None)
    memory.check_before_run("parallel_warmup", cfg, _io(tmp_path), read=lambda: None)  # local: CPU


def test_nvidia_smi_is_read_when_present(monkeypatch, tmp_path):
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\nprintf 'NVIDIA H100 80GB HBM3, 81559\\nNVIDIA H100 80GB HBM3, 81559\\n'\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    assert memory.read_device() == DeviceReport("NVIDIA H100 80GB HBM3", 81_559 * 2**20, 2)
