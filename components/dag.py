"""The pipeline DAG, read from dvc.yaml (the one definition of stages, their inputs and outputs).

Stage functions never hard-code paths: ``npr stage NAME`` hands them a ``StageIO`` built from the stage's
entry in dvc.yaml. Inputs are keyed by ``<upstream stage>/<name>`` (the path under ``artifacts/``),
outputs by their name under ``artifacts/<stage>/``.

Besides its data outputs a stage has three report files, all declared in dvc.yaml:
- ``artifacts/<stage>/metrics.json`` (an out, cached): everything the stage returned plus provenance;
- ``metrics/<stage>.json`` or ``metrics/<stage>/`` (DVC ``metrics``, git-tracked, ``cache: false``): the
  few flat numbers ``dvc metrics show/diff`` and ``dvc exp show`` compare (``components.reporting``);
- ``plots/<stage>/`` (an out, git-tracked, ``cache: false``): the rows the top-level ``plots:`` draw.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from graphlib import TopologicalSorter
from pathlib import Path

import yaml

from components.errors import UserError

DVC_FILE = Path("dvc.yaml")
ARTIFACTS = "artifacts"
STAGE_RECORD = "metrics.json"  # artifacts/<stage>/metrics.json: the stage's full metrics and provenance
PLOTS_DIR = "plots"  # plots/<stage>/: the stage's DVC plot data


class DagError(UserError, ValueError):
    """dvc.yaml is missing, malformed, or names a stage that does not exist."""


@dataclass(frozen=True)
class StageSpec:
    name: str
    cmd: str
    deps: tuple[str, ...]
    outs: tuple[str, ...]
    params: tuple[str, ...]
    metrics: tuple[str, ...]

    @property
    def upstream(self) -> tuple[str, ...]:
        """Stages whose artifacts this stage reads."""
        ups = []
        for dep in self.deps:
            parts = Path(dep).parts
            if len(parts) >= 3 and parts[0] == ARTIFACTS and parts[1] not in ups:
                ups.append(parts[1])
        return tuple(ups)


@dataclass
class StageIO:
    """Resolved paths for one stage run.

    ``outputs``: the data outputs under ``artifacts/<stage>/``; ``metrics``: the stage's full JSON record;
    ``summary``: its flat DVC metrics file (or directory); ``plots``: its DVC plot-data directory.
    """

    stage: str
    inputs: dict[str, Path] = field(default_factory=dict)
    outputs: dict[str, Path] = field(default_factory=dict)
    metrics: Path | None = None
    summary: Path | None = None
    plots: Path | None = None

    @property
    def work_dir(self) -> Path | None:
        """``artifacts/<stage>/work``: checkpoints, per-step logs and the W&B run id (not a DVC out)."""
        anchor = next(iter(self.outputs.values()), None) or self.metrics
        return None if anchor is None else Path(anchor).parent / "work"

    def input(self, key: str) -> Path:
        if key not in self.inputs:
            raise DagError(
                f"stage {self.stage!r} has no input {key!r} in dvc.yaml; it has {sorted(self.inputs)}"
            )
        return self.inputs[key]

    def output(self, key: str) -> Path:
        if key not in self.outputs:
            raise DagError(
                f"stage {self.stage!r} has no output {key!r} in dvc.yaml; it has {sorted(self.outputs)}"
            )
        return self.outputs[key]

    def upstream_output(self, stage: str, name: str) -> Path:
        """The path of ``artifacts/<stage>/<name>``; it must be a declared input of this stage."""
        return self.input(f"{stage}/{name}")


def _as_paths(items: list | None) -> tuple[str, ...]:
    out = []
    for item in items or []:
        if isinstance(item, dict):
            out.extend(item.keys())
        else:
            out.append(str(item))
    return tuple(out)


def _params(items: list | None) -> tuple[str, ...]:
    out: list[str] = []
    for item in items or []:
        if isinstance(item, dict):  # {params.yaml: [keys]}
            for keys in item.values():
                out.extend(keys or [])
        else:
            out.append(str(item))
    return tuple(out)


def load_stages(path: Path = DVC_FILE) -> dict[str, StageSpec]:
    """All stages of dvc.yaml, in file order."""
    if not path.exists():
        raise DagError(f"{path} not found (run from the repository root)")
    data = yaml.safe_load(path.read_text()) or {}
    stages = data.get("stages")
    if not isinstance(stages, dict) or not stages:
        raise DagError(f"{path} has no stages")
    specs = {}
    for name, body in stages.items():
        specs[name] = StageSpec(
            name=name,
            cmd=str(body.get("cmd", "")),
            deps=_as_paths(body.get("deps")),
            outs=_as_paths(body.get("outs")),
            params=_params(body.get("params")),
            metrics=_as_paths(body.get("metrics")),
        )
    return specs


def stage_order(path: Path = DVC_FILE) -> list[str]:
    """A topological order of dvc.yaml's stages; ties broken by file order (stable)."""
    specs = load_stages(path)
    names = list(specs)
    graph = {n: {u for u in specs[n].upstream if u in specs} for n in names}
    ts = TopologicalSorter(graph)
    ts.prepare()
    order: list[str] = []
    while ts.is_active():
        ready = sorted(ts.get_ready(), key=names.index)
        order.extend(ready)
        ts.done(*ready)
    return order


def branch_order(specs: dict[str, StageSpec]) -> list[str]:
    """A topological order that finishes a branch before it starts the next: of the stages ready to run,
    the one downstream of the most recently placed stage comes first (ties: file order). On the NPR DAG:
    ... reject_filter, parallel_warmup, papo_rl, sequential_warmup, sr_rl, pr1_coldstart, pr1_rl, evaluate:
    the order reports list checkpoints in (a branch's SFT next to its RL)."""
    names = list(specs)
    ups = {n: [u for u in specs[n].upstream if u in specs] for n in names}
    order: list[str] = []
    while len(order) < len(names):
        ready = [n for n in names if n not in order and all(u in order for u in ups[n])]
        if not ready:
            raise DagError(f"dvc.yaml's stages have a cycle among {sorted(set(names) - set(order))}")

        def latest_upstream(n: str) -> int:
            return max((order.index(u) for u in ups[n]), default=-1)

        # max() keeps the first of equals, so file order breaks ties
        order.append(max(ready, key=latest_upstream))
    return order


def model_stages(path: Path = DVC_FILE) -> list[str]:
    """The stages that write a model (an ``artifacts/<stage>/model`` out), in ``branch_order``."""
    specs = load_stages(path)
    return [n for n in branch_order(specs) if f"{ARTIFACTS}/{n}/model" in specs[n].outs]


def chain_to(stage: str, path: Path = DVC_FILE) -> list[str]:
    """``stage`` and every stage it depends on, in ``branch_order``: what must run for ``stage`` to run."""
    specs = load_stages(path)
    if stage not in specs:
        raise DagError(f"unknown stage {stage!r}; dvc.yaml has: {', '.join(specs)}")
    needed = ancestors(specs, stage) | {stage}
    return [n for n in branch_order(specs) if n in needed]


def ancestors(specs: dict[str, StageSpec], stage: str) -> set[str]:
    """Every stage ``stage`` depends on, directly or through others."""
    seen: set[str] = set()
    todo = [u for u in specs[stage].upstream if u in specs]
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(u for u in specs[name].upstream if u in specs)
    return seen


def independent_stages(specs: dict[str, StageSpec]) -> set[str]:
    """Stages that may run at the same time as another one: neither depends on the other (on the NPR DAG,
    the NPR branch parallel_warmup -> papo_rl and the SR branch sequential_warmup -> sr_rl)."""
    up = {name: ancestors(specs, name) for name in specs}
    return {
        a
        for a in specs
        if any(b != a and b not in up[a] and a not in up[b] for b in specs)
    }


def stage_io(stage: str, path: Path = DVC_FILE) -> StageIO:
    specs = load_stages(path)
    if stage not in specs:
        raise DagError(f"unknown stage {stage!r}; dvc.yaml has: {', '.join(specs)}")
    spec = specs[stage]
    io = StageIO(stage=stage)
    for dep in spec.deps:
        parts = Path(dep).parts
        if len(parts) >= 3 and parts[0] == ARTIFACTS:
            io.inputs["/".join(parts[1:])] = Path(dep)
    for out in spec.outs:
        parts = Path(out).parts
        if parts == (ARTIFACTS, stage, STAGE_RECORD):
            io.metrics = Path(out)
        elif parts == (PLOTS_DIR, stage):
            io.plots = Path(out)
        else:
            io.outputs["/".join(parts[2:]) if len(parts) >= 3 and parts[0] == ARTIFACTS else out] = Path(out)
    if spec.metrics:
        io.summary = Path(spec.metrics[0])
    return io
