"""`npr run` as a user runs it: SIGTERM mid-stage, or SIGINT while Prefect's temporary server is still
starting, stops it within seconds and leaves no process behind (issue 43: it used to keep retrying the
lost server's event websocket for more than 30 s)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
from ops_testing import REPO, VENV_BIN

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# from the signal to npr's exit, and to the last process under it gone (the supervisor's grace is 3 s)
STOP_WITHIN_S = 10.0


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    repo = tmp_path_factory.mktemp("npr_run_signals") / "repo"
    subprocess.run(["git", "clone", "-q", str(REPO), str(repo)], check=True)
    subprocess.run([str(VENV_BIN / "npr"), "data", "fetch"], cwd=repo, check=True, capture_output=True)
    yield repo


def _descendants(pid: int) -> list[psutil.Process]:
    with contextlib.suppress(psutil.NoSuchProcess):
        return psutil.Process(pid).children(recursive=True)
    return []


def _running_a_stage(pid: int) -> bool:
    """A stage's own process (`npr stage NAME`, under dvc repro) is running under ``pid``."""
    for p in _descendants(pid):
        with contextlib.suppress(psutil.NoSuchProcess):
            cmd = p.cmdline()[:4]
            if "stage" in cmd and any(part.endswith("npr") for part in cmd):
                return True
    return False


def _flow_started(pid: int) -> bool:
    """The supervised child (the flow's process) exists, before any stage."""
    return bool(_descendants(pid))


@pytest.mark.parametrize(
    "sig, ready",
    [(signal.SIGTERM, _running_a_stage), (signal.SIGINT, _flow_started)],
    ids=["SIGTERM-mid-stage", "SIGINT-while-the-server-starts"],
)
def test_npr_run_stops_within_seconds_and_leaves_nothing_behind(
    clone: Path, tmp_path: Path, sig: signal.Signals, ready: Callable[[int], bool]
) -> None:
    env = {
        **os.environ,
        "PATH": f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}",
        "PREFECT_HOME": str(tmp_path / "prefect_home"),
    }
    log_path = tmp_path / "npr-run.log"
    with log_path.open("wb") as log:
        npr = subprocess.Popen(
            [str(VENV_BIN / "npr"), "run", "--profile", "tiny", "--stages", "sample_orz,seed,npr_zero",
             "--set", "tracking.mode=disabled"],
            cwd=clone, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        seen: list[psutil.Process] = []
        try:
            deadline = time.monotonic() + 600
            while not ready(npr.pid):
                assert npr.poll() is None, log_path.read_text(errors="replace")[-3000:]
                assert time.monotonic() < deadline, "npr run never reached the point to signal it"
                time.sleep(0.2)
            seen = _descendants(npr.pid)
            assert seen, "npr run runs its flow in no child process"
            sent = time.monotonic()
            os.kill(npr.pid, sig)  # to npr alone, as `kill PID` or a container stop would
            code = npr.wait(timeout=60)
            exited_s = time.monotonic() - sent
            _, alive = psutil.wait_procs(seen, timeout=max(0.1, STOP_WITHIN_S - exited_s))
            gone_s = time.monotonic() - sent
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(npr.pid, signal.SIGKILL)
            for p in seen:  # never leave a process behind, even when the test fails
                with contextlib.suppress(psutil.NoSuchProcess):
                    p.kill()
    output = log_path.read_text(errors="replace")
    assert code == 128 + sig, output[-3000:]
    assert exited_s < STOP_WITHIN_S, f"npr run took {exited_s:.1f} s to exit:\n{output[-3000:]}"
    assert not alive, f"left behind after {gone_s:.1f} s: {[p.pid for p in alive]}\n{output[-3000:]}"
    assert f"{sig.name} received, stopping the run" in output
    # the run's compute precision is said once, before the flow starts (issue 43)
    assert output.count("precision (run.autocast=auto): auto: ") == 1, output[:2000]
