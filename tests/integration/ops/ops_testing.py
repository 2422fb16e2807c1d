"""Helpers of the ops tests: an S3-protocol server (moto) and throw-away git+DVC repositories.

The S3 server is moto's WSGI app on werkzeug, bound to 127.0.0.1 on a random port. It can be stopped and
restarted on the same port with its data kept (moto's backends live in this process), and it can be
told to go away after N object uploads, which is how a push is interrupted half way.
"""

from __future__ import annotations

import configparser
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
VENV_BIN = Path(sys.executable).parent


class S3Server:
    """moto's S3 on 127.0.0.1:<random port>; ``stop``/``start`` keep the port and the stored objects."""

    def __init__(self) -> None:
        self.port = 0
        self._server = None
        self._thread: threading.Thread | None = None
        self._puts_left: int | None = None
        self._down = threading.Event()
        self._lock = threading.Lock()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        from moto.moto_server.werkzeug_app import (
            DomainDispatcherApplication,
            MotoRequestHandler,
            create_backend_app,
        )
        from werkzeug.serving import make_server

        app = DomainDispatcherApplication(create_backend_app)
        self._down.clear()
        self._puts_left = None
        self._server = make_server(
            "127.0.0.1", self.port, self._guard(app), threaded=True, request_handler=MotoRequestHandler
        )
        self.port = self._server.server_port
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._down.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()  # refuse new connections instead of leaving them in the backlog
            self._thread.join(timeout=10)
            self._server = None

    def go_down_after_puts(self, n: int) -> None:
        """After ``n`` more data-object uploads (``.../files/md5/...``) the server stops (503 on live connections)."""
        with self._lock:
            self._puts_left = n

    def _guard(self, app):
        def wsgi(environ, start_response):
            if self._down.is_set():  # keep-alive connections outlive the listener; refuse them too
                start_response("503 Service Unavailable", [("Content-Length", "0")])
                return [b""]
            response = app(environ, start_response)
            if environ["REQUEST_METHOD"] == "PUT" and "/files/md5/" in environ.get("PATH_INFO", ""):
                with self._lock:
                    if self._puts_left is not None:
                        self._puts_left -= 1
                        if self._puts_left <= 0:
                            self._puts_left = None
                            self._down.set()
                            threading.Thread(target=self.stop, daemon=True).start()
            return response

        return wsgi


def shipped_remote_bucket(remote: str = "s3") -> tuple[str, str]:
    """(bucket, prefix) of a remote in the repository's own .dvc/config."""
    parser = configparser.ConfigParser()
    parser.read(REPO / ".dvc" / "config")
    url = parser[f"'remote \"{remote}\"'"]["url"]
    assert url.startswith("s3://"), url
    bucket, _, prefix = url[len("s3://") :].partition("/")
    return bucket, prefix


def create_bucket(bucket: str) -> None:
    import boto3

    boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"]).create_bucket(Bucket=bucket)


def list_keys(bucket: str) -> list[str]:
    import boto3

    pages = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"]).get_paginator("list_objects_v2")
    return sorted(o["Key"] for page in pages.paginate(Bucket=bucket) for o in page.get("Contents", []))


# --------------------------------------------------------------------------------------------------
# a small two-stage DVC project (our own; the real stages are far too slow for these tests)

MAKE_DATA = """\
import os, random, sys, yaml
p = yaml.safe_load(open("params.yaml"))["make_data"]
rng = random.Random(p["seed"])
os.makedirs("artifacts/make_data/shards", exist_ok=True)
for i in range(p["n_shards"]):
    with open(f"artifacts/make_data/shards/part-{i:05d}.bin", "wb") as f:
        f.write(rng.randbytes(p["shard_bytes"]))
with open(os.environ["NPR_TEST_RUN_LOG"], "a") as f:
    f.write("make_data\\n")
"""

TRAIN = """\
import hashlib, os, pathlib, yaml
p = yaml.safe_load(open("params.yaml"))["train"]
h = hashlib.sha256(str(p["lr"]).encode())
for shard in sorted(pathlib.Path("artifacts/make_data/shards").iterdir()):
    h.update(shard.read_bytes())
os.makedirs("artifacts/train/model", exist_ok=True)
pathlib.Path("artifacts/train/model/weights.bin").write_bytes(h.digest() * 4096)
with open(os.environ["NPR_TEST_RUN_LOG"], "a") as f:
    f.write("train\\n")
"""

DVC_YAML = """\
stages:
  make_data:
    cmd: {python} make_data.py
    deps: [make_data.py]
    params: [make_data]
    outs: [artifacts/make_data/shards]
  train:
    cmd: {python} train.py
    deps: [train.py, artifacts/make_data/shards]
    params: [train]
    outs: [artifacts/train/model]
"""

PARAMS = "make_data: {seed: 1, n_shards: 4, shard_bytes: 150000}\ntrain: {lr: 0.1}\n"


def run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None, **kw) -> subprocess.CompletedProcess:
    """Run a command with the venv first on PATH; fail with its output when it fails."""
    full_env = {**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}", "DVC_NO_ANALYTICS": "1"}
    proc = subprocess.run(cmd, cwd=cwd, env={**full_env, **(env or {})}, capture_output=True, text=True, **kw)
    if proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def make_dvc_project(path: Path) -> Path:
    """git + DVC repo with the shipped .dvc/config (its `local` and `s3` remotes) and two stages."""
    path.mkdir(parents=True)
    run(["git", "init", "-q"], path)
    run(["git", "config", "user.email", "ops-tests@example.invalid"], path)
    run(["git", "config", "user.name", "ops tests"], path)
    run([str(VENV_BIN / "dvc"), "init", "-q"], path)
    shutil.copy(REPO / ".dvc" / "config", path / ".dvc" / "config")
    (path / "make_data.py").write_text(MAKE_DATA)
    (path / "train.py").write_text(TRAIN)
    (path / "dvc.yaml").write_text(DVC_YAML.format(python=sys.executable))
    (path / "params.yaml").write_text(PARAMS)
    (path / ".gitignore").write_text("/artifacts/\n/dvc-remote/\n")
    return path


def git_commit(path: Path, message: str) -> None:
    run(["git", "add", "-A"], path)
    run(["git", "commit", "-q", "-m", message], path)


def tree_bytes(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` (relative path -> content), to compare workspaces byte for byte."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def copy_checkout(dest: Path) -> Path:
    """Tracked and untracked-but-not-ignored files of this checkout, as a fresh git repository."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for rel in filter(None, listed.split("\0")):
        src = REPO / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    run(["git", "init", "-q"], dest)
    run(["git", "config", "user.email", "ops-tests@example.invalid"], dest)
    run(["git", "config", "user.name", "ops tests"], dest)
    git_commit(dest, "copy of the checkout")
    return dest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def group_alive(pid: int, grace_s: float = 5.0) -> bool:
    """Whether any process of the group exists after ``grace_s`` (killed orphans take a moment to be reaped)."""
    deadline = time.monotonic() + grace_s
    while True:
        try:
            os.killpg(pid, 0)
        except ProcessLookupError:
            return False
        if time.monotonic() > deadline:
            return True
        time.sleep(0.1)


def inherited_dispositions(sig: signal.Signals):
    """For SIGINT, start the process with SIGINT ignored, as `cmd &` in a script does (a shell without job
    control): Python then installs no KeyboardInterrupt, and only an explicit handler stops it."""

    def ignore_sigint() -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    return ignore_sigint if sig == signal.SIGINT else None
