"""The device smoke (benchmarks/smoke_gpu.py) measures at the one-GPU profile's shapes: its model, its
parallel SFT row, its PAPO rollout and its merge semantics, read from the profile (overlay resolved)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from components.config import load_config

ROOT = Path(__file__).resolve().parents[3]


def _smoke():
    spec = importlib.util.spec_from_file_location("smoke_gpu", ROOT / "benchmarks" / "smoke_gpu.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_gpu_rows_take_the_one_gpu_profiles_shapes(in_repo):
    smoke = _smoke()
    cfg = load_config(profile=smoke.PROFILE)
    assert cfg.orchestration.gpu.per_node == 1  # the profile the smoke follows is the one-GPU one
    shape, sizes, name = smoke.profile_sizes()
    arch = cfg.models.architecture
    assert shape == dict(hidden=arch.hidden_size, intermediate=arch.intermediate_size,
                         layers=arch.num_hidden_layers, heads=arch.num_attention_heads,
                         kv_heads=arch.num_key_value_heads, head_dim=arch.head_dim, vocab=arch.vocab_size)  # fmt: skip
    assert sizes["seq"] == cfg.parallel_warmup.max_length == 32768
    assert sizes["papo_seq"] == cfg.papo_rl.verl.max_prompt_length + cfg.papo_rl.max_new_tokens == 18048
    assert sizes["merge_semantics"] == cfg.merge_semantics == "reread"
    assert name == "Qwen/Qwen3-1.7B shape (qwen3-1.7b-1gpu)"
    other = smoke.profile_sizes("qwen3-4b")[0]
    assert other["hidden"] == 2560 and other["layers"] == 36  # another profile, its own model


def test_the_training_rows_run_under_the_profiles_reread_semantics_on_cpu(in_repo):
    """What the GPU run does at the profile's shapes (reread rows, a PAPO length of its own), small."""
    import re

    import torch

    from components.models.tags import add_tag_tokens
    from components.models.tiny import tiny_test_world
    from components.structure import TagIds

    smoke = _smoke()
    torch.set_num_threads(1)
    _, tok = tiny_test_world(seed=0)
    model = smoke.build_model(smoke.SMALL, torch.device("cpu"), torch.float32)
    add_tag_tokens(model, tok, "npr")
    tags = TagIds.from_tokenizer(tok, "npr")
    rows = smoke.training_rows(model, tok, tags, "small", 256, torch.device("cpu"), 320, "reread")
    sft, papo = rows
    # the rows are built to about the asked length (parallel_example closes its last block after it)
    sft_len = int(re.search(r"(\d+) tokens, reread\)", sft[0]).group(1))
    papo_len = int(re.search(r"2 rollouts x (\d+) tokens, reread\)", papo[0]).group(1))
    assert 256 <= sft_len <= 264 and 320 <= papo_len <= 328, rows
    for row in rows:
        ratio = float(re.search(r"measured/planned ([\d.]+)", row[3]).group(1))
        assert 0.3 <= ratio <= 1.5, row  # the planner's bound (the whole response re-read) is above the peak
