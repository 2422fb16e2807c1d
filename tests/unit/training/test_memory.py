"""The memory planner against allocations measured on the tiny model (CPU), and its refusals.

Measured with ``components.training.memory_probe`` (bytes of the tensors a block creates, at its peak).
"""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache, Qwen3Config, Qwen3ForCausalLM

from components.config import load_config
from components.training import memory
from components.training.memory import ForwardShape, MemoryPlanError, ModelShape
from components.training.memory_probe import measure
from components.training.precision import build_adamw
from components.training.token_logprobs import token_log_probs

torch.set_num_threads(1)


def _tiny_model(dtype=torch.float32, layers=None) -> tuple[Qwen3ForCausalLM, ModelShape]:
    cfg = load_config(profile="tiny")
    shape = memory.model_shape(cfg.models)
    config = Qwen3Config(
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=layers or shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        head_dim=shape.head_dim,
        vocab_size=shape.vocab,
        max_position_embeddings=shape.max_positions,
        tie_word_embeddings=True,
    )
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return Qwen3ForCausalLM(config).to(dtype), ModelShape.from_hf_config(config)


def test_shape_counts_the_parameters_and_kv_bytes_of_a_real_model():
    model, shape = _tiny_model()
    assert shape.params == sum(p.numel() for p in model.parameters())
    rows, length = 3, 40
    cache = DynamicCache()
    with torch.no_grad():
        model(input_ids=torch.randint(0, shape.vocab, (rows, length)), past_key_values=cache, use_cache=True)
    held = sum(layer.keys.nbytes + layer.values.nbytes for layer in cache.layers)
    assert held == rows * length * shape.kv_bytes_per_token(4)


def test_the_qwen3_4b_profile_plans_with_the_published_shape():
    shape = memory.model_shape(load_config(profile="qwen3-4b").models)
    assert shape.params == 4_022_468_096  # Qwen3-4B: 4.0B parameters, 3.6B of them outside the embeddings
    assert shape.params - shape.embedding_params - shape.hidden == 3_633_509_376
    # 144 KiB of bf16 KV per token: a 32k-token sequence holds 4.4 GiB (the issue's ~4.5 GiB)
    assert shape.kv_bytes_per_token(2) == 147_456
    assert 32_048 * shape.kv_bytes_per_token(2) / memory.GIB == pytest.approx(4.40, abs=0.01)


def test_a_model_directory_config_wins_over_the_declared_shape(tmp_path):
    model, shape = _tiny_model(layers=2)
    model.config.save_pretrained(tmp_path)
    cfg = load_config(profile="qwen3-4b")
    assert memory.model_shape(cfg.models, tmp_path) == shape


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("checkpointing", [False, True])
@pytest.mark.parametrize("masked", [True, False])
def test_activation_estimate_matches_measured_allocations(dtype, checkpointing, masked):
    """Forward + backward through the trainers' scorer: the planner's activation terms vs the peak bytes
    the tensors of the step held (weights pre-exist; gradients are counted by the state terms)."""
    model, shape = _tiny_model(dtype)
    model.train()
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    rows, length = 4, 256
    ids = torch.randint(0, shape.vocab, (rows, length))
    if masked:
        mask = (
            torch.tril(torch.ones(length, length, dtype=torch.bool)).expand(rows, 1, length, length).clone()
        )
    else:
        mask = torch.ones(rows, length, dtype=torch.long)
    source = (torch.arange(length) - 1).clamp(min=0).expand(rows, -1)
    with measure("cpu") as reading:
        log_prob, _ = token_log_probs(
            model,
            ids,
            mask,
            torch.arange(length).expand(rows, -1),
            source,
            ids,
            torch.ones(rows, length),
            chunk_tokens=256,
        )
        log_prob.sum().backward()
    w = 4 if dtype == torch.float32 else 2
    terms = memory.training_activation_terms(
        shape, ForwardShape(rows, length, masked), w, checkpointing, "x.max_length", 256
    )
    estimate = sum(t.bytes for t in terms if "bool" not in t.name)  # the bool mask is the caller's input
    assert 0.85 <= estimate / reading.peak_bytes <= 1.15, (estimate, reading.peak_bytes)


def test_checkpointing_keeps_the_gradient_and_frees_memory_as_planned():
    model, shape = _tiny_model()
    model.train()
    rows, length = 2, 128
    ids = torch.randint(0, shape.vocab, (rows, length))
    mask = torch.ones(rows, length)
    args = (
        ids,
        torch.ones(rows, length, dtype=torch.long),
        None,
        (torch.arange(length) - 1).clamp(min=0).expand(rows, -1),
        ids,
        mask,
    )
    grads, peaks = [], []
    for on in (False, True):
        if on:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.zero_grad(set_to_none=True)
        with measure("cpu") as reading:
            token_log_probs(model, *args)[0].sum().backward()
        grads.append([p.grad.clone() for p in model.parameters()])
        peaks.append(reading.peak_bytes)
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5 * float(a.abs().max()) + 1e-9)
    plan = [
        sum(
            t.bytes
            for t in memory.training_activation_terms(
                shape, ForwardShape(rows, length, False), 4, on, "x.max_length"
            )
        )
        for on in (False, True)
    ]
    assert peaks[1] < 0.6 * peaks[0] and plan[1] < 0.6 * plan[0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_optimizer_state_is_what_the_planner_counts(dtype):
    """fp32: 4 (weights) + 4 + 8; bf16: 2 (weights) + 4 (master) + 4 (fp32 grad) + 8 bytes per parameter."""
    model, shape = _tiny_model(dtype, layers=2)
    ids = torch.randint(0, shape.vocab, (2, 32))
    with measure("cpu") as reading:
        optimizer = build_adamw(model, lr=1e-4, betas=(0.9, 0.99))
        model(input_ids=ids).logits.float().mean().backward()
        optimizer.step()
    held_before = shape.params * (4 if dtype == torch.float32 else 2)  # the model's own weights
    state = sum(t.bytes for t in memory.training_state_terms(shape, 4 if dtype == torch.float32 else 2))
    created = reading.end_bytes  # what the optimizer and gradients still hold
    n_tensors = len(list(model.parameters()))
    assert created - 8 * n_tensors <= state - held_before <= created  # AdamW's per-tensor step counters


def test_a_config_that_cannot_fit_fails_before_any_work_naming_the_setting():
    # the torch engine's KV for 64 x (2048 + 30000) tokens (the profile serves evaluate with SGLang instead)
    torch_eval = ["evaluate.generation.backend=torch", "evaluate.generation.batch_size=64"]
    cfg = load_config(profile="qwen3-4b", overrides=torch_eval)
    with pytest.raises(MemoryPlanError, match=r"evaluate\.generation\.batch_size"):
        memory.check_stage("evaluate", cfg)
    cfg = load_config(profile="qwen3-4b", overrides=["parallel_warmup.gradient_checkpointing=false"])
    with pytest.raises(MemoryPlanError, match=r"parallel_warmup\.gradient_checkpointing: true"):
        memory.check_stage("parallel_warmup", cfg)
    cfg = load_config(profile="qwen3-4b", overrides=["papo_rl.verl.gpu_memory_utilization=0.02"])
    with pytest.raises(MemoryPlanError, match=r"raise papo_rl\.verl\.gpu_memory_utilization"):
        memory.check_stage("papo_rl", cfg)


def test_run_stage_checks_the_plan_before_reading_anything(tmp_path, monkeypatch):
    from components.dag import StageIO
    from components.stages import run_stage

    cfg = load_config(profile="qwen3-4b", overrides=["papo_rl.verl.gpu_memory_utilization=0.02"])
    io = StageIO(
        "papo_rl", {"parallel_warmup/model": tmp_path / "missing"}, {"model": tmp_path / "out" / "model"}
    )
    with pytest.raises(MemoryPlanError):
        run_stage("papo_rl", cfg, io)
    assert not (tmp_path / "out").exists()  # not even the work dir was prepared


def test_cpu_profile_stages_plan_nothing_and_ask_for_no_gpu():
    cfg = load_config(profile="tiny")
    for stage in ("seed", "npr_zero", "distill", "parallel_warmup", "papo_rl", "evaluate"):
        assert memory.plan_stage(stage, cfg) == []
        assert memory.gpus_for(stage, cfg) == 0
    on_gpu = load_config(profile="tiny", overrides=["run.device=cuda", "run.dtype=bfloat16"])
    assert [p.gpus for p in memory.plan_stage("papo_rl", on_gpu)] == [1, 1]
    assert memory.check_stage("papo_rl", on_gpu)  # the tiny model fits anywhere


def test_reread_plans_the_laid_out_copies_of_parallel_stages_only():
    """Under merge_semantics reread a parallel sequence carries re-read copies (up to one more response):
    the SFT and verl actor plans of parallel stages grow; sequential stages plan the same."""
    reread = load_config(profile="qwen3-4b")
    assert reread.merge_semantics == "reread"
    isolated = reread.model_copy(update={"merge_semantics": "isolated"})

    def peak(cfg, stage):
        return max(p.total_bytes for p in memory.plan_stage(stage, cfg))

    for stage in ("parallel_warmup", "papo_rl"):
        assert peak(reread, stage) > peak(isolated, stage), stage
    for stage in ("sequential_warmup", "sr_rl"):
        assert peak(reread, stage) == peak(isolated, stage), stage
    assert memory.reread_tokens(reread.merge_semantics, reread.papo_rl, 100) == 100
    assert memory.reread_tokens(isolated.merge_semantics, isolated.papo_rl, 100) == 0
    assert memory.reread_tokens(reread.merge_semantics, reread.sr_rl, 100) == 0
