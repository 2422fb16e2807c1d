"""`npr server` as a real process: its UI calls its own port; SIGTERM and SIGINT stop the Prefect server it
started (no orphan on the port)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import urllib.request
from pathlib import Path

import psutil
import pytest
from ops_testing import REPO, VENV_BIN, free_port, group_alive, inherited_dispositions

from components.ops.prefect_ops import api_url, wait_healthy

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_to_npr_server_stops_the_prefect_server(tmp_path: Path, sig: signal.Signals) -> None:
    port = free_port()
    env = {
        **os.environ,
        "PATH": f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}",
        "PREFECT_HOME": str(tmp_path / "prefect_home"),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    }
    log = (tmp_path / "npr-server.log").open("wb")
    npr = subprocess.Popen(
        [str(VENV_BIN / "npr"), "server", "--port", str(port), "--no-register"],
        cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        preexec_fn=inherited_dispositions(sig),
    )  # fmt: skip
    server_pids: list[int] = []
    try:
        wait_healthy(api_url("127.0.0.1", port), 150, npr)
        # the UI must call this server's API, not the default port's
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/ui-settings", timeout=10) as response:
            assert json.loads(response.read())["api_url"] == api_url("127.0.0.1", port)
        server_pids = [c.pid for c in psutil.Process(npr.pid).children()]
        assert server_pids, "npr server started no child"
        os.kill(npr.pid, sig)  # to npr alone, as `kill PID` or systemd would; Ctrl-C's SIGINT likewise
        assert npr.wait(timeout=90) is not None
    finally:
        if npr.poll() is None:
            os.killpg(npr.pid, signal.SIGKILL)
        for pid in server_pids:  # never leave a server behind, even when the test fails
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        log.close()
    output = (tmp_path / "npr-server.log").read_text(errors="replace")
    assert "stopping the Prefect server" in output, output[-2000:]
    for pid in server_pids:
        assert not group_alive(pid, grace_s=10), f"Prefect server group {pid} outlived npr server"
    assert not _port_open(port)
