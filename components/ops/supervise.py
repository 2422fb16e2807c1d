"""Run a long command in a child process that a signal stops, with everything under it, within seconds.

Why: `npr run` runs the pipeline flow with Prefect's temporary API server. Prefect swaps SIGTERM for its own
handler while a flow runs and, on the signal, reports the crash to that server first; with the server
gone it retried the event websocket for more than 30 s, and the stages' `dvc repro` and `npr stage`
processes kept running (issue 43). So `npr run` supervises instead: the flow runs in a child process in its
own session; the supervisor never imports Prefect, and on SIGINT, SIGTERM or SIGHUP it stops the child's
session and every process under the child (a descendant may have started a session of its own: Ray, a
server), SIGTERM first, SIGKILL after a short grace.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from typing import Any

import psutil

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# How long the child's processes get to exit on SIGTERM before SIGKILL (a stage's checkpoint on disk is
# written atomically, so killing one mid-write loses nothing a resume needs).
GRACE_S = 3.0


class _Stopped(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise_stopped(signum: int, _frame: Any) -> None:
    raise _Stopped(signum)


def _tree(pid: int) -> list[psutil.Process]:
    """``pid`` and every process under it (by parent links, so across sessions too)."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def stop_tree(proc: subprocess.Popen, grace_s: float = GRACE_S) -> list[int]:
    """SIGTERM to ``proc``'s session and every process under it, SIGKILL to what is left after ``grace_s``.
    Returns the pids that were signalled."""
    procs = _tree(proc.pid)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        for p in procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.send_signal(sig)
        if sig == signal.SIGTERM:
            _, alive = psutil.wait_procs(procs, timeout=grace_s)
            procs = alive + [p for p in _tree(proc.pid) if p not in alive]  # started during the grace
            if not procs:
                break
    psutil.wait_procs(procs, timeout=grace_s)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace_s)
    return [p.pid for p in procs]


def run_supervised(argv: Sequence[str], env: dict[str, str] | None = None) -> int:
    """Run ``argv`` in its own session and return its exit status; a stop signal to this process stops it
    and everything under it, then returns 128 + the signal's number (the shell's convention)."""
    previous = {sig: signal.signal(sig, _raise_stopped) for sig in STOP_SIGNALS}
    proc = None
    try:
        proc = subprocess.Popen(list(argv), env=env, start_new_session=True)
        return proc.wait()
    except _Stopped as stop:
        # a second signal must not abort the stop half way
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
        print(f"npr: {stop} received, stopping the run and every process under it", flush=True)
        started = time.monotonic()
        if proc is not None:
            stop_tree(proc)
        print(f"npr: stopped in {time.monotonic() - started:.1f} s", flush=True)
        return 128 + stop.signum
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
