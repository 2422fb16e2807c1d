"""Suite-wide settings: quiet, offline, single-threaded torch (2-core CI), run from the repo root."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from _pytest.nodeid import coerce_node_id  # where pytest 9.2 keeps a node's id (above)

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"

for key, value in {
    "DO_NOT_TRACK": "1",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    # tests that start Prefect's ephemeral server in-process get the CLI's 120 s (components.env), not
    # Prefect's 20 s, which a loaded 2-core machine missed (test_gpu_checkout's pull steps)
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
    "DVC_NO_ANALYTICS": "1",
    "GX_ANALYTICS_ENABLED": "false",
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "WANDB_MODE": "offline",
    "WANDB_SILENT": "true",
    "TOKENIZERS_PARALLELISM": "false",
    # Ray's workers at the tests' priority, not raylet's default nice 15: under two pytest workers a verl
    # job's actors were starved by the other worker's test (verl tests timed out only under -n 2)
    "RAY_worker_niceness": "0",
}.items():
    os.environ.setdefault(key, value)


# Variables that point a process at a Prefect server or database. A test that leaves one changed sends every
# later test on its worker, and each process they start, to a server that is gone: CI's e2e `npr run` once
# inherited a stopped test server's PREFECT_API_URL and failed with "Failed to reach API".
PREFECT_POINTERS = ("PREFECT_API_URL", "PREFECT_HOME", "PREFECT_PROFILES_PATH", "PREFECT_API_KEY")


@pytest.fixture(autouse=True)
def _prefect_pointers_restored(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fails the test that changes one of ``PREFECT_POINTERS`` without undoing it (monkeypatch undoes its own
    changes before this runs), and puts the old values back so the rest of the worker is unaffected."""
    before = {key: os.environ.get(key) for key in PREFECT_POINTERS}
    yield
    changed = sorted(key for key, value in before.items() if os.environ.get(key) != value)
    for key in changed:
        if before[key] is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = before[key]
    if changed:
        pytest.fail(f"{request.node.nodeid} left {changed} changed in os.environ (use monkeypatch)")


@pytest.fixture(autouse=True, scope="session")
def _torch_single_thread() -> None:
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a hard dependency
        return
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The read-only public data beside the checkout (tests may read it; the product never needs it)."""
    if not SHARED_DATA.exists():
        pytest.skip(f"shared data not present at {SHARED_DATA}")
    return SHARED_DATA


@pytest.fixture()
def in_repo(monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(REPO)
    return REPO


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`make test` runs on two pytest-xdist workers with ``--dist loadgroup``: a test file is a group of its
    own (its module fixtures are built once, on one worker), and the files marked ``xdist_group("ray")``
    (they start Ray clusters: verl's main_ppo, the replay buffer's TransferQueue, the verl benchmark) share
    one group, so two Ray clusters never run at once on CI's two cores (a run that let them hit load 16).

    The group reaches xdist's scheduler as a ``@<group>`` suffix of the test's node id. pytest-xdist 3.8.0
    writes it to ``item._nodeid``, which pytest 9.2 no longer reads (a node id is ``item._id`` now), so the
    groups were silently ignored and the Ray files ran side by side on both workers: a fresh-clone
    `make test` had verl's 2-rank job and the vLLM rollout's two servers at once, and Ray's memory monitor
    killed workers at 95% of 24 GiB. The suffix is written here, where pytest reads it (xdist's own write,
    after this, changes nothing; were it to land too, the scheduler reads the last ``@`` part, the same
    group)."""
    grouping = bool(getattr(config.option, "loadgroup", False))
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
        if grouping:
            marks = item.iter_markers("xdist_group")
            names = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default")) for m in marks})
            item._id = coerce_node_id(f"{item.nodeid}@{'_'.join(names)}")
