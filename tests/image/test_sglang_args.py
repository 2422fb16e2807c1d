"""Every SGLang command line the project renders parses with the pinned SGLang's own argument parser, and
each flag lands in the ServerArgs field it is meant for, with the value the spec holds.

What is parsed: for every shipped profile, each stage's launched server (``components.engine.serving.
server_spec``, the checkpoint's weight version included), with and without the EXPERIMENTAL isolated-merge
plugin, and the Kubernetes server's argv (infra/k8s/sglang-server.yaml). SGLang's parser is built as
``sglang.srt.server_args.prepare_server_args`` builds it; ``ServerArgs.__post_init__`` is not run (it
reads the model and the GPU).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest
import yaml

from components.config import load_config, profile_names
from components.engine.config import GenerationConfig
from components.engine.serving import server_spec
from components.ops.launch import SGLANG, SGLANG_FLAGS, SGLANG_SWITCHES, server_command

REPO = Path(__file__).resolve().parents[2]
KEY_ENV = "NPR_SGLANG_API_KEY"
# begins with "-", as one in 64 keys from secrets.token_urlsafe do: SGLang must still read it as the key
KEY = "-k3y"
SKIPPED = {"image", "python", "module", "env", "api_key_env"}  # not SGLang flags (launch.py's SGLANG_META)


@pytest.fixture(scope="module")
def sglang_parser() -> argparse.ArgumentParser:
    from sglang.srt.server_args import ServerArgs  # the pinned wheel, in .venv-image only

    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    return parser


def _generation_sections(cfg: Any) -> dict[str, GenerationConfig]:
    """Every stage's generation settings in a config (``stage.generation``)."""
    out = {}
    for name in type(cfg).model_fields:
        gen = getattr(getattr(cfg, name), "generation", None)
        if isinstance(gen, GenerationConfig):
            out[name] = gen
    return out


def _rendered() -> list[tuple[str, dict[str, Any]]]:
    cases = []
    for profile in profile_names():
        cfg = load_config(profile=profile, root=REPO)
        for stage, gen in _generation_sections(cfg).items():
            if gen.backend != "sglang":
                continue
            for merge in (False, True):
                gen_case = gen.model_copy(update={"server": "launch", "sglang_isolated_merge": merge})
                spec = server_spec(gen_case, REPO / f"artifacts/{stage}/model", 30123, REPO / gen.server_spec)
                spec["weight_version"] = "0" * 32  # a launched server is named by its checkpoint's md5
                cases.append((f"{profile}:{stage}:{'isolated' if merge else 'reread'}", spec))
    return cases


CASES = _rendered()


def test_every_shipped_sglang_stage_is_rendered() -> None:
    profiles = {name.split(":")[0] for name, _ in CASES}
    assert {"qwen3-4b", "qwen3-4b-8xh100", "qwen3-1.7b-1gpu"} <= profiles
    assert {name.split(":")[1] for name, _ in CASES} >= {"distill", "evaluate"}


def _check(parser: argparse.ArgumentParser, argv: list[str], spec: dict[str, Any]) -> None:
    assert argv[1:3] == ["-m", "sglang.launch_server"]
    parsed = parser.parse_args(argv[3:])  # SystemExit (argparse's error) on an unknown flag or a bad value
    actions = {opt: action for action in parser._actions for opt in action.option_strings}
    for key, flag in {**SGLANG_FLAGS, **SGLANG_SWITCHES}.items():
        if spec.get(key) is None or (key in SGLANG_SWITCHES and not spec[key]):
            continue
        action = actions[flag]
        text = str(spec[key])  # what the argv carries, converted as argparse converts it
        want = True if key in SGLANG_SWITCHES else action.type(text) if action.type else text
        assert getattr(parsed, action.dest) == want, (flag, action.dest)
    assert parsed.api_key == KEY


@pytest.mark.parametrize("name,spec", CASES, ids=[name for name, _ in CASES])
def test_a_launched_server_parses_with_sglangs_own_parser(sglang_parser, name, spec) -> None:
    argv = server_command(SGLANG, spec, "python", env={KEY_ENV: KEY})
    _check(sglang_parser, argv, spec)


def test_the_kubernetes_server_parses_with_sglangs_own_parser(sglang_parser) -> None:
    deployment = next(yaml.safe_load_all((REPO / "infra/k8s/sglang-server.yaml").read_text()))
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    # Kubernetes expands $(VAR) from the container's env before the process starts
    values = {"$(NPR_SERVE_MD5)": "0" * 32, f"$({KEY_ENV})": KEY}
    argv = [*container["command"], *container["args"]]
    for var, value in values.items():
        argv = [a.replace(var, value) for a in argv]
    parsed = sglang_parser.parse_args(argv[3:])
    assert (parsed.model_path, parsed.weight_version, parsed.api_key) == (
        "artifacts/served/model",
        "0" * 32,
        KEY,
    )


def test_the_parser_refuses_what_sglang_does_not_take(sglang_parser) -> None:
    # the check above has teeth: a flag SGLang does not know, and a value its type refuses
    with pytest.raises(SystemExit):
        sglang_parser.parse_args(["--model-path", "m", "--tp", "x"])
    with pytest.raises(SystemExit):
        sglang_parser.parse_args(["--model-path", "m", "--no-such-flag", "1"])


def test_this_is_the_image_environment() -> None:
    import numpy
    import sglang
    import torch
    import transformers

    from components.envlock import read_pins

    gpu = read_pins(REPO / "infra/gpu/requirements.txt", applicable_only=False)
    assert torch.__version__.split("+")[0] == gpu["torch"]
    assert (transformers.__version__, numpy.__version__, sglang.__version__) == (
        gpu["transformers"], gpu["numpy"], gpu["sglang"]
    )  # fmt: skip
