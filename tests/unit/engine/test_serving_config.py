"""The GPU profile's decode stages are served by SGLang, and their config says so consistently."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from components.config import load_config
from components.engine import GenerationConfig
from components.engine.serving import server_spec, spec_context_length
from components.ops.launch import sglang_server_command


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


def test_isolated_merge_is_off_by_default_and_launches_the_plugins_server_when_on(in_repo: Path) -> None:
    from components.engine.serving import SGLangServerError
    from components.ops.launch import ISOLATED_MERGE_ENV

    for profile in ("tiny", "qwen3-4b"):
        cfg = load_config(profile=profile)
        assert not cfg.distill.generation.sglang_isolated_merge
        assert not cfg.evaluate.generation.sglang_isolated_merge
    off = server_spec(GenerationConfig(backend="sglang", merge_mode="reprefill"), "m", port=41234)
    argv = sglang_server_command(off)
    assert "--attention-backend" not in argv and "--page-size" not in argv
    assert "--disable-piecewise-cuda-graph" not in argv and ISOLATED_MERGE_ENV not in off["env"]
    gen = GenerationConfig(backend="sglang", merge_mode="reprefill", sglang_isolated_merge=True)
    on = server_spec(gen, "m", port=41234)
    argv = sglang_server_command(on)
    assert argv[argv.index("--attention-backend") + 1] == "triton"
    assert argv[argv.index("--page-size") + 1] == "1"
    assert "--disable-piecewise-cuda-graph" in argv
    assert on["env"] == {"SGLANG_RETURN_ORIGINAL_LOGPROB": "1", ISOLATED_MERGE_ENV: "1"}
    clash = gen.model_copy(update={"server_args": {"page_size": 16}})
    with pytest.raises(SGLangServerError, match="page_size"):
        server_spec(clash, "m", port=41234)


def test_isolated_merge_needs_a_launched_sglang_server() -> None:
    with pytest.raises(ValidationError, match="sglang_isolated_merge"):
        GenerationConfig(sglang_isolated_merge=True)  # torch backend
    with pytest.raises(ValidationError, match="sglang_isolated_merge"):
        GenerationConfig(
            backend="sglang", merge_mode="reprefill", server="attach", sglang_isolated_merge=True
        )


def test_the_client_marks_isolated_requests_with_their_sample_response_start() -> None:
    import asyncio

    from components.engine.backends.sglang_client import SGLangClient
    from components.engine.backends.sglang_isolated import parse_request_params
    from components.structure import NPR, TagIds

    tags = TagIds(NPR, {tag: 100 + i for i, tag in enumerate(NPR.tags)})
    answer = {"meta_info": {"output_token_logprobs": [[-0.5, 7, None]], "finish_reason": {"type": "stop"}}}

    def payloads(client: SGLangClient, route: int | None) -> dict:
        sent = []

        async def post(path, payload):
            sent.append(payload)
            return answer

        client.post = post
        params = {"temperature": 1.0}
        asyncio.run(client([1, 2, 3], params, route=route))
        assert params == {"temperature": 1.0}  # the caller's dict is not changed
        return sent[0]

    marked = payloads(SGLangClient("http://x", isolated=([5, 9], tags)), route=1)
    assert marked["extra_key"] == "npr-isolated:9"
    assert parse_request_params(marked["sampling_params"]["custom_params"]) == (9, tags)
    assert marked["sampling_params"]["temperature"] == 1.0
    plain = payloads(SGLangClient("http://x"), route=1)
    assert "extra_key" not in plain and "custom_params" not in plain["sampling_params"]


def test_generate_sglang_gives_each_sample_its_prompt_length_as_response_start(monkeypatch) -> None:
    from components.engine.async_driver import controllers_for
    from components.engine.backends import sglang_client
    from components.models.tiny import tiny_test_world
    from components.structure import TagIds

    _, tok = tiny_test_world(seed=0)
    tags = TagIds.from_tokenizer(tok, "npr")
    prompts = ["add 2 and 3", "a longer prompt with more words in it <step> 1: x </step>"]
    seen = []

    async def fake_generate_async(tokenizer, prompts, cfg, tags, client, *rest):
        seen.append(client.isolated)
        return []

    monkeypatch.setattr(sglang_client, "generate_async", fake_generate_async)
    gen = GenerationConfig(
        mode="parallel", backend="sglang", merge_mode="reprefill", sglang_isolated_merge=True
    )
    sglang_client.generate_sglang(tok, prompts, gen, tags)
    starts, sent_tags = seen[-1]
    assert sent_tags == tags
    assert starts == [len(c.prompt_ids) for c in controllers_for(tok, prompts, gen, tags)]
    assert starts[0] < starts[1]
    sglang_client.generate_sglang(tok, prompts, gen.model_copy(update={"mode": "sequential"}), tags)
    assert seen[-1] is None  # sequential decoding never forks: requests go out unmarked
    with pytest.raises(ValueError, match="TagIds"):
        sglang_client.generate_sglang(tok, prompts, gen, None)
