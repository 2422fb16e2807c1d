"""The GPU profile's decode stages are served by SGLang, and their config says so consistently."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from components.config import load_config
from components.engine import GenerationConfig
from components.ops.launch import sglang_server_command
from components.ops.sglang_server import server_spec, spec_context_length


def test_qwen_profile_serves_distill_and_evaluate_with_sglang(in_repo: Path) -> None:
    cfg = load_config(profile="qwen3-4b")
    for stage in ("distill", "evaluate"):
        gen = getattr(cfg, stage).generation
        assert (gen.backend, gen.merge_mode, gen.server) == ("sglang", "reprefill", "launch")
        assert Path(gen.server_spec).is_file()
        # prompts the RL stages allow (verl.max_prompt_length) + 30000 new tokens fit the server
        context = spec_context_length(gen)
        assert context is not None and context >= cfg.npr_zero.verl.max_prompt_length + gen.max_new_tokens
    tiny = load_config(profile="tiny")
    assert tiny.distill.generation.backend == tiny.evaluate.generation.backend == "torch"
    assert tiny.evaluate.generation.merge_mode == "shared_kv"


def test_a_stage_launched_server_is_local_and_serves_the_stage_checkpoint(in_repo: Path) -> None:
    gen = GenerationConfig(backend="sglang", merge_mode="reprefill", server_args={"dp_size": 1})
    spec = server_spec(gen, "artifacts/papo_rl/model", port=41234)
    argv = sglang_server_command(spec)
    assert argv[argv.index("--model-path") + 1] == "artifacts/papo_rl/model"
    assert argv[argv.index("--host") + 1] == "127.0.0.1" and argv[argv.index("--port") + 1] == "41234"
    assert argv[argv.index("--dp-size") + 1] == "1"
    assert "--enable-deterministic-inference" not in argv  # off in the spec: slower kernels
    on = sglang_server_command({**spec, "enable_deterministic_inference": True})
    assert "--enable-deterministic-inference" in on
    assert not any("SGLANG_RETURN_ORIGINAL_LOGPROB" in a for a in argv)  # env, not a flag
    assert spec["env"]["SGLANG_RETURN_ORIGINAL_LOGPROB"] == "1"


def test_generation_config_rejects_what_a_server_cannot_do() -> None:
    with pytest.raises(ValidationError, match="needs the torch backend"):
        GenerationConfig(backend="sglang", merge_mode="shared_kv")
    with pytest.raises(ValidationError, match="server_args"):
        GenerationConfig(backend="sglang", merge_mode="reprefill", server_args={"port": 1})
    with pytest.raises(ValidationError, match="server_args"):
        GenerationConfig(backend="sglang", merge_mode="reprefill", server_args={"tp": 2})
