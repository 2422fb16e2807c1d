"""A stage's SGLang server, for real: started from the spec, healthy, serving the right model, always stopped;
and the client's behaviour when the server fails (HTTP 5xx, abort, a dead process), against the stand-in
server (tests/support/sglang_standin.py) run as a subprocess exactly as ``sglang.launch_server`` would be."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import yaml

from components.engine import GenerationConfig, generate
from components.engine.backends.sglang_client import SGLangError
from components.engine.serving import (
    SGLangServerError,
    attached,
    check_context_length,
    context_length_for,
    launched,
    serving,
)
from components.models.tiny import tiny_test_world
from components.structure import TagIds

TWO_PLANS = "<guideline><plan>1: add</plan><plan>2: mul</plan></guideline>"


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    model, tok = tiny_test_world(seed=0)
    path = tmp_path_factory.mktemp("world")
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return tok, path


def _spec(tmp_path: Path, **extra) -> Path:
    spec = {
        "python": sys.executable,
        "module": "tests.support.sglang_standin",
        "model_path": "replaced-by-the-stage",
        "host": "0.0.0.0",
        "port": 30000,
        "tp_size": 1,
        "context_length": 256,
        "random_seed": 0,
        "env": {"SGLANG_RETURN_ORIGINAL_LOGPROB": "1"},
        **extra,
    }
    path = tmp_path / "server.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


@pytest.fixture(scope="module")
def server(world, tmp_path_factory):
    """One stand-in server for the tests that do not kill it; every request it serves is logged."""
    _, path = world
    tmp = tmp_path_factory.mktemp("server")
    log = tmp / "requests.jsonl"
    cfg = _cfg(
        _spec(tmp, enable_deterministic_inference=True), mode="parallel", max_new_tokens=40, max_step_tokens=6
    )
    os.environ["SGLANG_STANDIN_REQUEST_LOG"] = str(log)
    try:
        with serving(path, cfg, tmp / "logs") as served:
            yield served, log
    finally:
        os.environ.pop("SGLANG_STANDIN_REQUEST_LOG", None)


def _arm(url: str, fault: str) -> None:
    import urllib.request

    req = urllib.request.Request(
        f"{url}/_standin/fault", data=json.dumps({"fault": fault}).encode(), method="POST"
    )
    urllib.request.urlopen(req, timeout=10).read()


def _cfg(spec: Path, **kw) -> GenerationConfig:
    return GenerationConfig(
        backend="sglang", merge_mode="reprefill", server_spec=str(spec), server_start_timeout_s=120, **kw
    )


def _prompts(tok, n: int) -> list[str]:
    chat = [{"role": "user", "content": "2+3?"}]
    return [tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)] * n


def _server_processes(port: str) -> list[int]:
    import psutil

    out = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmd = proc.info["cmdline"] or []
        if "tests.support.sglang_standin" in cmd and port in cmd:
            out.append(proc.info["pid"])
    return out


def test_requests_carry_sglang_params_seeds_and_shared_prefixes(world, server) -> None:
    tok, _ = world
    served, log = server
    assert served.server_url.startswith("http://127.0.0.1:") and not served.server_url.endswith(":30000")
    tags = TagIds.from_tokenizer(tok, "npr")
    before = len(log.read_text().splitlines()) if log.exists() else 0
    gens = generate(None, tok, _prompts(tok, 2), served, tags, [TWO_PLANS] * 2)
    assert all(g.parallel_taken and g.blocks[0].merged and g.backend == "sglang" for g in gens)
    requests = [json.loads(line) for line in log.read_text().splitlines()[before:]]
    # per request: token ids in, SGLang's sampling parameter names, a seed of its own
    sp = requests[0]["sampling_params"]
    assert {"max_new_tokens", "stop_token_ids", "temperature", "top_p", "top_k", "sampling_seed"} <= set(sp)
    assert sp["skip_special_tokens"] is False and sp["no_stop_trim"] is True
    assert all(r["return_logprob"] for r in requests)
    seeds = [r["sampling_params"]["sampling_seed"] for r in requests]
    assert len(set(seeds)) == len(seeds)
    # the branches of a block share the prefix (the main stream's ids through </guideline>), then each
    # adds <step> + its label, scored through logprob_start_len; the merge re-sends prefix + both branches
    step = tok.convert_tokens_to_ids("<step>")
    firsts = [r for r in requests if r["input_ids"].count(step) == 1]
    fork = max(len(r["input_ids"]) for r in requests if step not in r["input_ids"])
    pairs = [r for r in firsts if r["logprob_start_len"] == len(r["input_ids"]) - 1 - 3]
    assert len(pairs) == 4 and all(r["input_ids"][fork] == step for r in pairs)
    assert len({tuple(r["input_ids"][:fork]) for r in pairs}) == 1  # identical prompts: one shared prefix
    takeaway = tok.convert_tokens_to_ids("<takeaway>")
    merges = [r for r in requests if r["input_ids"].count(step) == 2 and r["input_ids"][-1] == takeaway]
    assert len(merges) == 2 and all(r["logprob_start_len"] == len(r["input_ids"]) - 2 for r in merges)


@pytest.mark.parametrize(("fault", "message"), [("http500", "HTTP 500"), ("abort", "aborted")])
def test_server_failures_are_clear_errors(world, server, fault: str, message: str) -> None:
    tok, _ = world
    served, _ = server
    _arm(served.server_url, fault)
    seq = served.model_copy(update={"mode": "sequential", "max_new_tokens": 8, "batch_size": 1})
    with pytest.raises(SGLangError, match=message):
        generate(None, tok, _prompts(tok, 3), seq)
    assert len(generate(None, tok, _prompts(tok, 1), seq)) == 1  # the server itself is fine


def test_attach_checks_the_served_weights_not_a_path(world, server, tmp_path: Path, monkeypatch) -> None:
    """The server is named by its checkpoint's DVC md5 (--weight-version): the same weights anywhere are
    accepted; another checkpoint that the client finds under the very relative path the server reports
    (the server resolved it in its own directory, as the k8s server does with artifacts/<stage>/model) is
    refused, where comparing the paths accepted it."""
    import shutil

    tok, path = world
    served, _ = server
    with attached(served.server_url, path) as same:
        assert same == served.server_url
    server_dir, client_dir = tmp_path / "server", tmp_path / "client"
    shutil.copytree(path, server_dir / "model")
    other_model, _ = tiny_test_world(seed=1)
    other_model.save_pretrained(client_dir / "model")
    tok.save_pretrained(client_dir / "model")
    monkeypatch.chdir(server_dir)
    cfg = _cfg(_spec(tmp_path), max_new_tokens=8, batch_size=1)
    repo = str(Path(__file__).resolve().parents[3])  # the stand-in's module, from the server's own directory
    with launched(Path("model"), cfg, tmp_path / "logs", env={"PYTHONPATH": repo}) as url:
        monkeypatch.chdir(client_dir)
        with attached(url, path):  # the same weights, another path
            pass
        with pytest.raises(SGLangServerError, match="serves weights .* not .*DVC md5"), attached(url, Path("model")):
            pass
    attach_cfg = served.model_copy(update={"server": "attach"})
    assert context_length_for(attach_cfg) == 256 == context_length_for(served)


def test_context_length_is_checked_before_any_work(world, server) -> None:
    tok, _ = world
    served, _ = server
    check_context_length(256, 56, 200, "distill")  # fits exactly
    with pytest.raises(SGLangServerError, match=r"57 tokens\) \+ generation.max_new_tokens \(200\)"):
        check_context_length(256, 57, 200, "distill")
    # a request that does not fit is rejected by the server with SGLang's own message
    too_long = served.model_copy(update={"mode": "sequential", "max_new_tokens": 250})
    with pytest.raises(SGLangError, match="maximum context length of 256"):
        generate(None, tok, _prompts(tok, 1), too_long)


def test_a_server_dying_mid_run_is_a_clear_error_and_is_cleaned_up(world, tmp_path: Path) -> None:
    tok, path = world
    cfg = _cfg(_spec(tmp_path), max_new_tokens=8, batch_size=1)
    with pytest.raises(KeyboardInterrupt), launched(path, cfg, tmp_path / "logs") as url:
        port = url.rsplit(":", 1)[1]
        assert _server_processes(port)
        _arm(url, "exit")
        with pytest.raises(SGLangError, match="lost the connection"):
            generate(None, tok, _prompts(tok, 2), cfg.model_copy(update={"server_url": url}))
        raise KeyboardInterrupt  # then Ctrl-C in the stage: the launcher must still clean up
    assert not _server_processes(port)
    with pytest.raises(SGLangError, match="cannot reach"):
        generate(None, tok, _prompts(tok, 1), cfg.model_copy(update={"server_url": url}))


def test_server_that_dies_before_health_reports_its_log(world, tmp_path: Path) -> None:
    cfg = _cfg(_spec(tmp_path))
    with (
        pytest.raises(SGLangServerError, match="exited with code 1") as info,
        launched(tmp_path / "no-such-model", cfg, tmp_path / "logs"),
    ):
        pass
    assert "model load failed" in str(info.value)


def test_sigterm_to_the_stage_stops_its_server(world, tmp_path: Path) -> None:
    """A stage killed with SIGTERM (a task timeout) must not leave its server running on the GPUs."""
    import signal
    import subprocess
    import time

    _, path = world
    spec = _spec(tmp_path)
    script = (
        "import sys, time\n"
        "from components.engine import GenerationConfig\n"
        "from components.engine.serving import launched\n"
        f"cfg = GenerationConfig(backend='sglang', merge_mode='reprefill', server_spec={str(spec)!r},"
        " server_start_timeout_s=120)\n"
        f"with launched({str(path)!r}, cfg, {str(tmp_path / 'logs')!r}) as url:\n"
        "    print(url, flush=True)\n"
        "    time.sleep(300)\n"
    )
    stage = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    url = stage.stdout.readline().strip()
    port = url.rsplit(":", 1)[1]
    assert _server_processes(port)
    stage.send_signal(signal.SIGTERM)
    assert stage.wait(timeout=60) == 128 + signal.SIGTERM
    deadline = time.monotonic() + 10
    while _server_processes(port) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _server_processes(port)


def test_a_server_with_an_api_key_serves_every_client_that_holds_it(world, tmp_path: Path, monkeypatch) -> None:
    """The GPU pool's jobs set NPR_SGLANG_API_KEY, and the launcher then starts the server with --api-key
    (even on 127.0.0.1). The stand-in enforces it as SGLang's middleware does (401 on everything but
    /health*), so the launcher's model check and the generate client must both send the key."""
    import urllib.error
    import urllib.request

    tok, path = world
    monkeypatch.setenv("NPR_SGLANG_API_KEY", "test-key-123")
    cfg = _cfg(_spec(tmp_path, api_key_env="NPR_SGLANG_API_KEY"), max_new_tokens=8)
    with serving(path, cfg, tmp_path / "logs") as served:
        url = served.server_url
        # a client without the key is refused, with SGLang's answer; /health stays open for probes
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{url}/get_model_info", timeout=10)
        assert refused.value.code == 401
        assert urllib.request.urlopen(f"{url}/health", timeout=10).status == 200
        # the stage's own requests carry it: the model check passed above, and decoding works
        gens = generate(None, tok, _prompts(tok, 2), served)
        assert len(gens) == 2 and all(g.backend == "sglang" for g in gens)


def test_a_samples_requests_stay_on_one_data_parallel_replica(world, tmp_path: Path, monkeypatch) -> None:
    """With dp_size replicas and SGLang's default round-robin routing, a sample's branches and its merge
    land on different replicas and miss the prefix cache; the client pins each sample to one replica
    (routed_dp_rank), so every request after the first of a sample finds its prefix cached there."""
    tok, path = world
    log = tmp_path / "requests.jsonl"
    monkeypatch.setenv("SGLANG_STANDIN_REQUEST_LOG", str(log))
    cfg = _cfg(_spec(tmp_path, dp_size=2), mode="parallel", max_new_tokens=40, max_step_tokens=6)
    tags = TagIds.from_tokenizer(tok, "npr")
    questions = ["2+3?", "4+1?", "7+2?"]
    prompts = [
        tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
        for q in questions
    ]
    with serving(path, cfg, tmp_path / "logs") as served:
        gens = generate(None, tok, prompts, served, tags, [TWO_PLANS] * 3)
    assert all(g.parallel_taken for g in gens)
    requests = [json.loads(line) for line in log.read_text().splitlines()]
    assert {r["dp_rank"] for r in requests} == {0, 1}  # both replicas serve
    for prompt in prompts:
        ids = tok.encode(prompt, add_special_tokens=False)
        mine = [r for r in requests if r["input_ids"][: len(ids)] == ids]
        assert len(mine) >= 4  # its first request, two branches, the merge (and what follows)
        # every request of the sample runs on one replica: the one whose cache holds its prefix
        assert len({r["dp_rank"] for r in mine}) == 1
