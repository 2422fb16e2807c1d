"""The vLLM backend's pieces that need no server: the request a controller extension becomes, the answer's
reading, the launch command, the config that selects it and its locked environment."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from components import envlock
from components.engine import GenerationConfig
from components.engine.backends.vllm_client import VLLMError, completion_request, parse_completion
from components.engine.serving import server_spec, spec_context_length
from components.ops.launch import LaunchSpecError, vllm_server_command

PARAMS = {
    "max_new_tokens": 7,
    "stop_token_ids": [4, 9],
    "temperature": 0.7,
    "top_p": 0.9,
    "top_k": -1,
    "repetition_penalty": 1.0,
    "sampling_seed": 11,
    "skip_special_tokens": False,
    "no_stop_trim": True,
}


def test_an_extension_becomes_a_token_id_completion_request() -> None:
    body = completion_request("m", [1, 2, 3], PARAMS)
    assert body["prompt"] == [[1, 2, 3]] and body["model"] == "m"
    assert (body["max_tokens"], body["stop_token_ids"], body["seed"]) == (7, [4, 9], 11)
    assert (body["temperature"], body["top_p"], body["top_k"]) == (0.7, 0.9, -1)
    assert body["logprobs"] == 0 and body["return_token_ids"] and not body["skip_special_tokens"]
    assert "prompt_logprobs" not in body  # asking for them would skip the prefix cache
    scored = completion_request("m", [1, 2, 3], {**PARAMS, "max_new_tokens": 0}, tail=2)
    assert scored["prompt_logprobs"] == 0 and scored["max_tokens"] == 1  # vLLM rejects max_tokens 0


def _answer(ids, lps, finish="stop", prompt_lps=None):
    choice = {"token_ids": ids, "logprobs": {"token_logprobs": lps}, "finish_reason": finish}
    if prompt_lps is not None:
        choice["prompt_logprobs"] = prompt_lps
    return {"choices": [choice]}


def test_an_answer_is_read_with_its_forced_tail_scored() -> None:
    prompt = [5, 6, 7]
    entries = [None, {"6": {"logprob": -1.5, "rank": 2}}, {"7": {"logprob": -0.25, "rank": 1}}]
    ids, lps, finish, tail = parse_completion(_answer([8, 4], [-0.1, -0.2], "stop", entries), prompt, tail=2)
    assert (ids, lps, finish, tail) == ([8, 4], [-0.1, -0.2], "stop", [-1.5, -0.25])
    with pytest.raises(VLLMError, match="aborted"):
        parse_completion(_answer([], [], "abort"), prompt)
    with pytest.raises(VLLMError, match="matching"):
        parse_completion(_answer([8, 4], [-0.1]), prompt)
    with pytest.raises(VLLMError, match="prompt tokens"):
        parse_completion(_answer([8], [-0.1], "length", entries[:2]), prompt, tail=2)


def test_the_vllm_spec_renders_a_local_float32_server_in_its_own_environment(in_repo: Path) -> None:
    gen = GenerationConfig(backend="vllm", merge_mode="reprefill")
    spec = server_spec(gen, "artifacts/papo_rl/model", port=41235)
    assert spec["environment"] == "vllm" and spec["env"]["VLLM_CPU_KVCACHE_SPACE"] == "1"
    argv = vllm_server_command(spec, python="/venv/bin/python", env={})
    assert argv[:3] == ["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    assert argv[argv.index("--model") + 1] == "artifacts/papo_rl/model"
    assert argv[argv.index("--host") + 1] == "127.0.0.1" and argv[argv.index("--port") + 1] == "41235"
    assert argv[argv.index("--dtype") + 1] == "float32" and "--enforce-eager" in argv
    assert not any(a.startswith("--api-key") for a in argv)
    assert vllm_server_command(spec, "p", env={"NPR_VLLM_API_KEY": "-k"})[-1] == "--api-key=-k"
    with pytest.raises(LaunchSpecError, match="must require an API key"):
        vllm_server_command(
            {k: v for k, v in spec.items() if k != "api_key_env"} | {"host": "0.0.0.0"}, env={}
        )
    with pytest.raises(LaunchSpecError, match="unknown"):
        vllm_server_command({**spec, "tp_size": 1})  # SGLang's name, not vLLM's
    assert spec_context_length(gen) == 512
    assert spec_context_length(gen.model_copy(update={"server_args": {"max_model_len": 256}})) == 256


def test_the_config_selects_vllm_only_with_a_re_reading_merge() -> None:
    with pytest.raises(ValidationError, match="needs the torch backend"):
        GenerationConfig(backend="vllm", merge_mode="shared_kv")
    with pytest.raises(ValidationError, match="server_args"):
        GenerationConfig(backend="vllm", merge_mode="reprefill", server_args={"tp_size": 2})
    ok = GenerationConfig(backend="vllm", merge_mode="reprefill", server_args={"max_model_len": 256})
    assert ok.served and not GenerationConfig().served


def test_the_vllm_environment_is_locked_apart_from_the_project(in_repo: Path) -> None:
    tgt = envlock.target("vllm")
    assert envlock.stale(tgt) is None
    pins = envlock.read_pins(tgt.output)
    main = envlock.read_pins(envlock.target("cpu").output)
    assert pins["vllm-cpu"] == "0.31.0"
    # the server runs the trainer's kernels and tokenizer
    for shared in ("torch", "transformers", "tokenizers"):
        assert pins[shared] == main[shared]
    assert not {"torchvision", "torchaudio", "torchcodec", "triton"} & set(pins)
    assert "prefect" not in pins  # not the project's environment
    assert envlock.venv_of(tgt) == envlock.ROOT / ".venv-vllm"
    assert envlock.venv_of(envlock.target("cpu")) is None
    # this process is never the server's environment, whatever it has installed
    assert envlock.environment()["lock"] == "requirements.lock"
