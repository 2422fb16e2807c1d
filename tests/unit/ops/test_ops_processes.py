"""Process handling of components.ops.prefect_ops: whole process groups stop; health waits fail clearly."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from components.ops.prefect_ops import PrefectOpsError, stop_process_group, wait_healthy


def _alive(pgid: int, grace_s: float = 5.0) -> bool:
    """Whether any process of the group exists after ``grace_s`` (killed orphans take a moment to be reaped)."""
    deadline = time.monotonic() + grace_s
    while True:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        if time.monotonic() > deadline:
            return True
        time.sleep(0.1)


def test_stop_process_group_takes_children_along() -> None:
    # a leader that ignores SIGINT and SIGTERM (like a worker whose server is gone) with a child
    proc = subprocess.Popen(["bash", "-c", "trap '' INT TERM; sleep 300 & wait"], start_new_session=True)
    time.sleep(0.5)
    start = time.monotonic()
    stop_process_group(proc, timeout_s=0.5)
    assert time.monotonic() - start < 10
    assert proc.poll() is not None and not _alive(proc.pid)


def test_wait_healthy_reports_a_dead_server_at_once() -> None:
    proc = subprocess.Popen(["bash", "-c", "exit 3"], start_new_session=True)
    proc.wait()
    with pytest.raises(PrefectOpsError, match="exited with code 3"):
        wait_healthy("http://127.0.0.1:9/api", timeout_s=30, proc=proc)


def test_wait_healthy_times_out_with_the_url() -> None:
    with pytest.raises(PrefectOpsError, match=r"127\.0\.0\.1:9/api not healthy"):
        wait_healthy("http://127.0.0.1:9/api", timeout_s=1)
