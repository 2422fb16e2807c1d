"""Ray for the GPU RL stages: a head the stage starts and stops itself, or a running cluster it submits to.

Two placements (``<stage>.verl.ray_address``):

- **Own head** (``ray_address: null``, one node): the stage, running in its gpu-pool job on the node that
  has the GPUs, starts ``ray start --head --block`` bound to ``verl.ray_head_host`` on free ports, runs
  verl's driver against it (``RAY_ADDRESS``), and stops the head's whole process group afterwards. Every
  worker runs on this node, so the paths handed to verl are this node's, checkpoints land here, and the
  merged model becomes the stage's DVC output here and is pushed from here by the flow.
- **Running cluster** (``ray_address: http://<head>:8265``): the npr-stage flow submits the stage as a
  Ray job (``infra/ray/job.yaml``: reproduce the stage with DVC on the cluster, push its outputs and the
  run-cache from there) with the repository at the launching commit as the job's working dir, waits for
  it, then restores the outputs from the DVC run-cache (``flows/stage.py``). Inside the job the stage runs
  its driver attached to that cluster (``RAY_ADDRESS=auto``) with inputs and checkpoints under
  ``verl.shared_dir``, a filesystem every node mounts (``npr config check`` requires it).

W&B, S3/DVC and pipeline settings reach every Ray worker: the head started here inherits them (workers
inherit the raylet's environment), and a submitted job carries them in its runtime env, written to a
0600 file rather than the command line (``RUNTIME_ENV_KEYS``). Authentication of the head (Ray's token
auth) is always on: a head started here uses the ``RAY_AUTH_TOKEN`` (or ``RAY_AUTH_TOKEN_PATH``) of the
environment, else a random token of its own that only its driver is given.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Environment a stage's Ray workers need (prefixes and names): W&B, S3 (boto/DVC), HF offline switches,
# the pipeline's run id and thread share, and our plugin list for `import verl`.
RUNTIME_ENV_PREFIXES = ("WANDB_", "AWS_", "NPR_", "HF_", "DVC_", "VERL_")
RUNTIME_ENV_KEYS = ("TOKENIZERS_PARALLELISM", "DO_NOT_TRACK")
# Never forwarded into a job's runtime env: the head's own auth settings stay with the head.
NOT_FORWARDED = ("RAY_AUTH_MODE",)
INSIDE_JOB_ENV = "NPR_RAY_INSIDE_JOB"  # set in a submitted job: the stage attaches to the cluster it runs in
HEAD_START_TIMEOUT_S = 180.0


class RayClusterError(RuntimeError):
    """The Ray head did not start, a job failed, or the cluster could not be reached; says which."""


def _stop_with_parent() -> None:
    """In the head's process, before ``ray start`` runs: ask Linux to send it SIGTERM when the process that
    started it dies. A stage killed with SIGKILL (a timeout, the OOM killer, a test) cannot stop its head,
    which lives in a process group of its own; without this the head and its workers would outlive it, and
    the rerun that resumes the stage would start a second head beside them. ``ray start --block`` stops the
    Ray processes it started when it is terminated."""
    if sys.platform.startswith("linux"):
        pr_set_pdeathsig = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def forwarded_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The variables of ``environ`` a stage's Ray workers get (see ``RUNTIME_ENV_PREFIXES``)."""
    environ = dict(os.environ if environ is None else environ)
    return {
        k: v
        for k, v in sorted(environ.items())
        if (k.startswith(RUNTIME_ENV_PREFIXES) or k in RUNTIME_ENV_KEYS) and k not in NOT_FORWARDED
    }


RAY_STARTED = "Ray runtime started."  # what ``ray start`` prints when the head is up (ray/scripts/scripts.py)


@dataclass
class RayHead:
    """A Ray head this process started (``ray start --head --block`` in its own process group)."""

    host: str
    gcs_port: int
    dashboard_port: int
    temp_dir: Path
    process: subprocess.Popen | None = None
    env: dict[str, str] = field(default_factory=dict)
    owns_temp_dir: bool = False  # removed when the head stops (it was made for it)
    dashboard: bool = True  # the dashboard and job API run (they start about ten more processes)

    @property
    def address(self) -> str:
        """What ``ray.init`` / ``RAY_ADDRESS`` takes."""
        return f"{self.host}:{self.gcs_port}"

    @property
    def dashboard_url(self) -> str:
        """The job API (``ray job submit --address``)."""
        return f"http://{self.host}:{self.dashboard_port}"

    @classmethod
    def start(
        cls,
        host: str = "127.0.0.1",
        num_gpus: int | None = None,
        num_cpus: int | None = None,
        temp_dir: Path | None = None,
        env: dict[str, str] | None = None,
        timeout_s: float = HEAD_START_TIMEOUT_S,
        dashboard: bool = True,
    ) -> RayHead:
        """Start a head on ``host`` with every port chosen free (two heads on one machine never collide),
        wait until it is up (its job API answers; without the dashboard, ``ray start`` has reported the
        runtime started), and return it. ``env``: the head's environment (inherited by every worker); Ray's
        token authentication is on, with its ``RAY_AUTH_TOKEN`` or a fresh random one."""
        env = dict(os.environ if env is None else env)
        # Token auth always (never an open job API, even on loopback): the given token, else a fresh random
        # one for this head alone, which its driver gets through ``head.env``.
        if not (env.get("RAY_AUTH_TOKEN") or env.get("RAY_AUTH_TOKEN_PATH")):
            env["RAY_AUTH_TOKEN"] = secrets.token_hex(32)
        env["RAY_AUTH_MODE"] = "token"
        # Ray runs its workers (verl's trainer and rollout actors) at nice 15 by default (raylet's
        # worker_niceness): beside any other busy process on the node, a stage in another lane of the same
        # pipeline or a test beside it, the training then gets almost no CPU. Workers run at the head's priority.
        env.setdefault("RAY_worker_niceness", "0")
        # Ray's sockets live under its temp dir and a unix socket path has at most 107 bytes: keep it short
        owned = temp_dir is None
        temp_dir = Path(temp_dir or tempfile.mkdtemp(prefix="npr-ray-"))
        temp_dir.mkdir(parents=True, exist_ok=True)
        head = cls(
            host, free_port(host), free_port(host), temp_dir, env=env, owns_temp_dir=owned, dashboard=dashboard
        )
        ports = {
            "--port": head.gcs_port,
            "--dashboard-port": head.dashboard_port,
            "--ray-client-server-port": free_port(host),
            "--dashboard-agent-listen-port": free_port(host),
            "--dashboard-agent-grpc-port": free_port(host),
            "--metrics-export-port": free_port(host),
            "--runtime-env-agent-port": free_port(host),
        }
        argv = [
            str(Path(sys.executable).with_name("ray"))
            if Path(sys.executable).with_name("ray").exists()
            else "ray",
            "start",
            "--head",
            "--block",
            "--node-ip-address",
            host,
            "--dashboard-host",
            host,
            "--include-dashboard",
            "true" if dashboard else "false",
            "--disable-usage-stats",
            "--temp-dir",
            str(temp_dir),
        ]
        for flag, port in ports.items():
            argv += [flag, str(port)]
        if num_gpus is not None:
            argv += ["--num-gpus", str(num_gpus)]
        if num_cpus is not None:
            argv += ["--num-cpus", str(num_cpus)]
        log = (temp_dir / "head.log").open("ab")
        head.process = subprocess.Popen(
            argv,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_stop_with_parent,
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if head.process.poll() is not None:
                raise RayClusterError(
                    f"ray start --head exited with code {head.process.returncode}: see {temp_dir / 'head.log'}"
                )
            if head.healthy():
                return head
            time.sleep(1.0)
        head.stop()
        raise RayClusterError(
            f"the Ray head on {host} did not answer within {timeout_s:.0f} s: see {temp_dir / 'head.log'}"
        )

    def healthy(self) -> bool:
        if not self.dashboard:
            # no job API to ask: ``ray start --block`` logs this line once GCS and the raylet are up
            log = self.temp_dir / "head.log"
            return log.exists() and RAY_STARTED in log.read_text(encoding="utf-8", errors="replace")
        request = urllib.request.Request(f"{self.dashboard_url}/api/version")
        token = self.env.get("RAY_AUTH_TOKEN")
        if not token and self.env.get("RAY_AUTH_TOKEN_PATH"):
            with contextlib.suppress(OSError):
                token = Path(self.env["RAY_AUTH_TOKEN_PATH"]).read_text().strip()
        if token:
            request.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(request, timeout=2) as reply:
                return reply.status == 200
        except OSError:
            return False

    def stop(self, grace_s: float = 10.0) -> None:
        """Stop the head and everything it started (its own process group; nothing else on the node)."""
        proc = self.process
        if proc is None or proc.poll() is not None and not _group_alive(proc.pid):
            return
        for sig in (signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
            deadline = time.monotonic() + grace_s
            while time.monotonic() < deadline and _group_alive(proc.pid):
                time.sleep(0.2)
            if not _group_alive(proc.pid):
                break
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=1)
        if self.owns_temp_dir:
            shutil.rmtree(self.temp_dir, ignore_errors=True)

    def __enter__(self) -> RayHead:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a group whose members are all zombies is gone for our purposes
    try:
        out = subprocess.run(
            ["ps", "-o", "stat=", "-g", str(pgid)], capture_output=True, text=True, check=False
        )
    except OSError:
        return True
    return any(not line.strip().startswith("Z") for line in out.stdout.splitlines() if line.strip())


def inside_submitted_job(environ: dict[str, str] | None = None) -> bool:
    """True in the process a submitted stage job runs (its driver attaches to that cluster)."""
    return bool((os.environ if environ is None else environ).get(INSIDE_JOB_ENV))


def run_driver(
    argv: list[str], address: str, env: dict[str, str] | None = None, log_path: Path | None = None
) -> int:
    """Run verl's driver (``argv``) attached to the cluster at ``address``; returns its exit code."""
    env = dict(os.environ if env is None else env)
    env["RAY_ADDRESS"] = address
    # the driver too ends with the stage (a killed stage must not leave verl's driver running)
    if log_path is None:
        return subprocess.call(argv, env=env, preexec_fn=_stop_with_parent)
    with log_path.open("ab") as log:
        return subprocess.call(
            argv, env=env, stdout=log, stderr=subprocess.STDOUT, preexec_fn=_stop_with_parent
        )


# ----------------------------------------------------------------------------------------- submitted jobs
def write_runtime_env(
    path: Path, env_vars: dict[str, str], working_dir: str = ".", excludes: list[str] | None = None
) -> Path:
    """A ``--runtime-env`` file (mode 0600: it may hold W&B and S3 keys, which a command line would show)."""
    payload = {"working_dir": working_dir, "env_vars": env_vars, "excludes": excludes or []}
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(payload, f, indent=1, sort_keys=True)
    return path


# Not uploaded with a job's working dir: outputs (pulled from the DVC remote on the cluster), environments,
# caches, the DVC cache (each node keeps its own), W&B runs.
JOB_EXCLUDES = [
    "artifacts/",
    ".venv/",
    "dvc-remote/",
    ".dvc/cache/",
    ".dvc/tmp/",
    "wandb/",
    ".prefect/",
    "data/",
]


def submit_stage_job(
    stage: str,
    spec: dict[str, Any],
    run_id: str,
    address: str,
    work_dir: Path,
    environ: dict[str, str] | None = None,
    timeout_s: float | None = None,
) -> subprocess.CompletedProcess:
    """Submit ``stage`` as a Ray job to the cluster at ``address`` and wait for it (``ray job submit`` streams
    its logs and exits with the job's status). ``spec``: infra/ray/job.yaml (its ``entrypoint`` reproduces
    the stage with DVC and pushes its outputs and run-cache); the working dir is the current checkout."""
    for key in ("entrypoint",):
        if key not in spec:
            raise RayClusterError(f"Ray job spec lacks {key!r}")
    env_vars = {**{k: str(v) for k, v in spec.get("env_vars", {}).items()}, **forwarded_env(environ)}
    env_vars["NPR_PIPELINE_RUN_ID"] = run_id
    env_vars[INSIDE_JOB_ENV] = "1"
    for key in NOT_FORWARDED:
        env_vars.pop(key, None)
    runtime = write_runtime_env(
        Path(work_dir) / f"ray-runtime-env-{stage}.json",
        env_vars,
        working_dir=spec.get("working_dir", "."),
        excludes=JOB_EXCLUDES,
    )
    entrypoint = spec["entrypoint"].format(stage=shlex.quote(stage))
    ray = (
        str(Path(sys.executable).with_name("ray"))
        if Path(sys.executable).with_name("ray").exists()
        else "ray"
    )
    argv = [
        ray, "job", "submit",
        "--address", address,
        "--submission-id", f"npr-{stage}-{run_id}",
        "--runtime-env", str(runtime),
        "--", "bash", "-c", entrypoint,
    ]  # fmt: skip
    try:
        return subprocess.run(
            argv, env=dict(os.environ if environ is None else environ), timeout=timeout_s, check=False
        )
    finally:
        runtime.unlink(missing_ok=True)
