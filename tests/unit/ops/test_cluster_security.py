"""No open cluster ports: whatever listens beyond loopback (the Ray head's dashboard and job API, the SGLang
server) requires a token or key that comes from a secret, and nothing in code, image or specs turns auth
off. Reads the real specs; the SGLang client is checked against a local HTTP server."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest
import yaml

from components.ops.launch import (
    LOOPBACK,
    SGLANG_API_KEY_ENV,
    LaunchSpecError,
    load_spec,
    sglang_server_command,
)

REPO = Path(__file__).resolve().parents[3]
INFRA = REPO / "infra"
AUTH_OFF = re.compile(r"RAY_AUTH_MODE[\"']?\s*[:=]\s*[\"']?(?!token\b)\w+")
PUBLIC = {"0.0.0.0", "::", "[::]"}


def _tracked_text_files() -> list[Path]:
    names = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        text=True,
    ).stdout.split()
    here = Path(__file__).relative_to(REPO).as_posix()
    keep = (".py", ".yaml", ".yml", ".json", ".md", ".toml", ".txt", "Dockerfile", "Makefile")
    return [REPO / n for n in names if n.endswith(keep) and n != here and (REPO / n).is_file()]


def test_nothing_turns_ray_auth_off() -> None:
    offenders = [
        f"{path.relative_to(REPO)}: {m.group(0)}"
        for path in _tracked_text_files()
        for m in AUTH_OFF.finditer(path.read_text(errors="replace"))
    ]
    assert offenders == [], "Ray token authentication is turned off in: " + "; ".join(offenders)


def _image_env() -> dict[str, str]:
    text = (INFRA / "gpu" / "Dockerfile").read_text().replace("\\\n", " ")
    env: dict[str, str] = {}
    for line in text.splitlines():
        if line.strip().upper().startswith("ENV "):
            for pair in shlex.split(line.strip()[4:]):
                key, _, value = pair.partition("=")
                env[key] = value
    return env


def _flag(command: str, name: str) -> str | None:
    for token in shlex.split(command):
        if token.startswith(f"{name}="):
            return token.split("=", 1)[1]
    return None


def test_the_ray_head_binds_to_the_cluster_network_with_token_auth() -> None:
    cluster = yaml.safe_load((INFRA / "ray" / "cluster.yaml").read_text())
    heads = [c for c in cluster["head_start_ray_commands"] if "ray start" in c]
    assert heads, "no `ray start --head` in infra/ray/cluster.yaml"
    for command in heads:
        host = _flag(command, "--dashboard-host")
        assert host is not None, f"the dashboard host must be explicit: {command}"
        assert host not in PUBLIC, f"the dashboard and job API listen on all interfaces: {command}"
    # every container of the cluster runs with token auth, the token read from a mounted secret file
    run_options = " ".join(cluster["docker"]["run_options"])
    assert _image_env().get("RAY_AUTH_MODE") == "token" or "RAY_AUTH_MODE=token" in run_options
    token_path = re.search(r"RAY_AUTH_TOKEN_PATH=(\S+)", run_options)
    assert token_path, "the nodes need the token: RAY_AUTH_TOKEN_PATH in docker.run_options"
    assert token_path.group(1) in cluster["file_mounts"], (
        "the token file is mounted from the operator's secret"
    )
    assert "RAY_AUTH_TOKEN=" not in (INFRA / "ray" / "cluster.yaml").read_text(), "no literal token in a spec"
    # job submitters on the gpu pool use token auth too
    stage = next(
        d
        for d in yaml.safe_load((REPO / "prefect.yaml").read_text())["deployments"]
        if d["name"] == "npr-stage"
    )
    assert stage["work_pool"]["job_variables"]["env"]["RAY_AUTH_MODE"] == "token"


def test_a_public_sglang_server_requires_an_api_key_from_a_secret() -> None:
    spec = load_spec(INFRA / "sglang" / "server.yaml")
    if str(spec.get("host", "127.0.0.1")) not in LOOPBACK:
        assert spec.get("api_key_env"), "infra/sglang/server.yaml listens beyond loopback without api_key_env"
    argv = sglang_server_command(spec, env={spec["api_key_env"]: "-s3cret"})
    assert "--api-key=-s3cret" in argv  # one token: a key beginning with "-" is not read as a flag
    with pytest.raises(LaunchSpecError, match=spec["api_key_env"]):
        sglang_server_command(spec, env={})  # an unset key never renders a public server without one
    with pytest.raises(LaunchSpecError, match="must require an API key"):
        sglang_server_command({k: v for k, v in spec.items() if k != "api_key_env"}, env={})
    # on loopback (a stage's own server on 127.0.0.1) the key is used when set, not required
    local = {**spec, "host": "127.0.0.1"}
    assert not any(a.startswith("--api-key") for a in sglang_server_command(local, env={}))
    assert "--api-key=s3cret" in sglang_server_command(local, env={spec["api_key_env"]: "s3cret"})
    # the k8s Deployment: a public host, the key from a secret reference, never a literal
    for doc in yaml.safe_load_all((INFRA / "k8s" / "sglang-server.yaml").read_text()):
        if doc.get("kind") != "Deployment":
            continue
        container = doc["spec"]["template"]["spec"]["containers"][0]
        args = container["args"]
        if args[args.index("--host") + 1] not in LOOPBACK:
            key_arg = next(a for a in args if a.startswith("--api-key="))  # one token, as launch.py renders it
            var = re.fullmatch(r"--api-key=\$\((\w+)\)", key_arg)
            assert var, f"--api-key must come from the environment, got {key_arg!r}"
            env = {e["name"]: e for e in container["env"]}
            assert "secretKeyRef" in env[var.group(1)]["valueFrom"]


class _Recorder(BaseHTTPRequestHandler):
    """Answers SGLang's native /generate (one request or a batch) with one token, recording the auth header."""

    seen: list[str | None] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        payload = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        _Recorder.seen.append(self.headers.get("Authorization"))
        item = {
            "meta_info": {"output_token_logprobs": [[-0.5, 7, None]], "finish_reason": {"type": "length"}}
        }
        batch = bool(payload["input_ids"]) and isinstance(payload["input_ids"][0], list)
        body = json.dumps([item] * len(payload["input_ids"]) if batch else item).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


def test_the_sglang_client_sends_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    # through the backend's public entry point, against a local server answering SGLang's /generate
    from components.engine.backends.sglang_client import generate_sglang
    from components.engine.config import GenerationConfig
    from components.models.tiny import tiny_test_world

    _, tokenizer = tiny_test_world(seed=0)
    server = HTTPServer(("127.0.0.1", 0), _Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}"
    cfg = GenerationConfig(mode="sequential", server_url=url, max_new_tokens=1)
    try:
        monkeypatch.setenv(SGLANG_API_KEY_ENV, "s3cret")
        generate_sglang(tokenizer, ["What is 1+1?"], cfg)
        first = list(_Recorder.seen)
        monkeypatch.delenv(SGLANG_API_KEY_ENV)
        generate_sglang(tokenizer, ["What is 1+1?"], cfg)
    finally:
        server.shutdown()
    assert first and set(first) == {"Bearer s3cret"}
    assert set(_Recorder.seen[len(first) :]) == {None}
