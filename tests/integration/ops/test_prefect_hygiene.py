"""Prefect processes that behave: a flow started by hand uses the running `npr server` (no second writer on
its SQLite file), `npr worker` stops on SIGTERM and SIGINT, and a script that calls a flow without a
`__main__` guard runs it once, without telemetry errors offline."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from ops_testing import REPO, VENV_BIN, free_port, group_alive, inherited_dispositions

from components.env import SERVER_FILE
from components.ops.prefect_ops import api_url, wait_healthy

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    return {**env, "PATH": f"{VENV_BIN}{os.pathsep}{env['PATH']}", "PREFECT_HOME": str(home), **extra}


def _kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """`npr server` (no deployments), as a user starts it; its PREFECT_HOME is shared with the tests."""
    tmp = tmp_path_factory.mktemp("prefect_hygiene")
    home = tmp / "prefect_home"
    port = free_port()
    log = (tmp / "server.log").open("wb")
    proc = subprocess.Popen(
        [str(VENV_BIN / "npr"), "server", "--port", str(port), "--no-register"],
        cwd=REPO, env=_env(home), stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    url = api_url("127.0.0.1", port)
    try:
        wait_healthy(url, 150, proc)
        deadline = time.monotonic() + 30
        while not (home / SERVER_FILE).exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        yield {"home": home, "url": url, "tmp": tmp, "proc": proc}
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(timeout=90)
        assert not (home / SERVER_FILE).exists(), "npr server left its URL record behind"
    finally:
        _kill_group(proc)
        log.close()


def test_npr_server_records_its_url_for_the_flows_started_by_hand(server: dict[str, Any]) -> None:
    from components.env import running_server_url

    assert json.loads((server["home"] / SERVER_FILE).read_text())["api_url"] == server["url"]
    assert running_server_url(server["home"]) == server["url"]
    assert running_server_url(server["tmp"] / "elsewhere") is None  # no record: an ephemeral API


@pytest.fixture(scope="module")
def checkout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A checkout with the promoted seed (the committed tiny instruct model), 10 held-out problems and a
    `fast` profile: the tiny one evaluated on those 10 problems, one sample each."""
    import shutil

    import yaml

    from components.artifacts import write_shards
    from components.data.synthetic import generate_problems

    root = tmp_path_factory.mktemp("nightly_checkout")
    for name in ("dvc.yaml", "params.yaml"):
        shutil.copy(REPO / name, root / name)
    for name in ("configs", "prompts"):
        shutil.copytree(REPO / name, root / name)
    fast = yaml.safe_load((REPO / "configs" / "tiny.yaml").read_text())
    fast["profile"] = "fast"
    fast["evaluate"]["benchmarks"] = [{"name": "tiny_test", "n_samples": 1, "k": 1, "max_problems": 10}]
    fast["nightly"].update(benchmarks=["tiny_test"], format_valid_floor=0.0, parallel_rate_floor=0.0)
    fast["grading"]["workers"] = 1
    fast["tracking"]["mode"] = "disabled"
    (root / "configs" / "fast.yaml").write_text(yaml.safe_dump(fast, sort_keys=False))
    problems = [dict(p, split="test") for p in generate_problems(10, 11, None)]
    write_shards(root / "artifacts" / "sample_orz" / "problems", problems, 1, stem="test")
    shutil.copytree(REPO / "models" / "tiny-instruct", root / "artifacts" / "seed" / "model")
    return root


def _npr(args: list[str], cwd: Path, home: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(VENV_BIN / "npr"), *args], cwd=cwd, env=_env(home), capture_output=True, text=True, timeout=300
    )


def test_a_nightly_run_by_hand_uses_the_running_server(server: dict[str, Any], checkout: Path) -> None:
    """Same PREFECT_HOME, no PREFECT_API_URL: the flow run is the server's, no temporary server, no lock."""
    promoted = _npr(
        ["nightly", "promote", "artifacts/seed/model", "--profile", "fast"], checkout, server["home"]
    )
    assert promoted.returncode == 0, promoted.stdout + promoted.stderr
    night = _npr(["nightly", "run", "--profile", "fast", "--checkpoint", "seed"], checkout, server["home"])
    output = night.stdout + night.stderr
    assert night.returncode == 0 and "nightly gate: PASS" in night.stdout, output[-3000:]
    assert "temporary server" not in output and "database is locked" not in output, output[-3000:]
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: server["url"]}), get_client(sync_client=True) as client:
        runs = {client.read_flow(r.flow_id).name: r for r in client.read_flow_runs()}
    assert runs["nightly-eval"].state.type.value == "COMPLETED"


def test_a_refused_night_by_hand_is_one_line_not_a_flow_traceback(
    server: dict[str, Any], checkout: Path
) -> None:
    """After the test above: the workspace's checkpoint changes (a retrain), the baseline is another's."""
    card = checkout / "artifacts" / "seed" / "model" / "README.md"
    card.write_text(card.read_text() + "\nretrained\n")
    night = _npr(["nightly", "run", "--profile", "fast", "--checkpoint", "seed"], checkout, server["home"])
    assert night.returncode == 2, night.stdout + night.stderr
    (line,) = night.stderr.strip().splitlines()
    assert (
        line.startswith("error: nightly gate refused") and "npr nightly promote artifacts/seed/model" in line
    )
    assert "Traceback" not in night.stdout + night.stderr


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_npr_worker_stops_on_a_signal(server: dict[str, Any], sig: signal.Signals) -> None:
    log_path = server["tmp"] / f"worker-{sig.name}.log"
    log = log_path.open("wb")
    proc = subprocess.Popen(
        [str(VENV_BIN / "npr"), "worker", "--pool", "cpu"],
        cwd=REPO, env=_env(server["home"]), stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        preexec_fn=inherited_dispositions(sig),
    )  # fmt: skip
    children: list[int] = []
    try:
        deadline = time.monotonic() + 120
        while "started" not in log_path.read_text(errors="replace") and time.monotonic() < deadline:
            assert proc.poll() is None, log_path.read_text(errors="replace")[-3000:]
            time.sleep(0.5)
        output = log_path.read_text(errors="replace")
        assert f"on {server['url']}" in output, output[-3000:]  # found the running server by itself
        children = [c.pid for c in psutil.Process(proc.pid).children()]
        assert children, "npr worker started no worker process"
        os.kill(proc.pid, sig)  # to npr alone, as `kill PID` or systemd would; Ctrl-C's SIGINT likewise
        assert proc.wait(timeout=60) == 0
    finally:
        _kill_group(proc)
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        log.close()
    assert "stopping the 'cpu' worker" in log_path.read_text(errors="replace")
    for pid in children:
        assert not group_alive(pid, grace_s=10), f"worker group {pid} outlived npr worker"


SCRIPT = textwrap.dedent(
    """
    # no `if __name__ == "__main__":` guard, on purpose
    import os
    import flows  # noqa: F401  (what a script importing one of the project's flows does first)
    from prefect import flow

    from components.grading.verify_pool import get_pool

    print("script top level ran in", os.getpid(), flush=True)


    @flow(name="grade-from-a-script")
    def grade() -> list:
        # pairs the fast path cannot settle go to the spawned math-verify pool
        return get_pool(2, 120).verify([("2", "\\\\sqrt{4}"), ("1/2", "\\\\frac{2}{4}")], 10.0, 1)


    print("graded", grade(), flush=True)
    """
)


def test_a_script_without_a_main_guard_runs_its_flow_once_without_telemetry_errors(tmp_path: Path) -> None:
    script = tmp_path / "nightly_by_hand.py"
    script.write_text(SCRIPT, encoding="utf-8")
    env = _env(tmp_path / "prefect_home", PYTHONPATH=str(REPO))
    for key in ("DO_NOT_TRACK", "PREFECT_SERVER_ANALYTICS_ENABLED"):  # as in a plain shell
        env.pop(key, None)
    proc = subprocess.run(
        [str(VENV_BIN / "python"), str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]
    assert proc.stdout.count("script top level ran") == 1, output[-4000:]  # pool workers did not re-run it
    assert "graded [(True, None), (True, None)]" in proc.stdout, output[-4000:]
    assert "Failed to send telemetry" not in output and "| ERROR" not in output, output[-4000:]
