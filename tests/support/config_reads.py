"""Which config sections a stage's computation reads: the check behind dvc.yaml's ``params:``.

DVC reruns a stage when one of its listed params changes, so a stage that reads a section its ``params:``
do not list keeps a stale output when that section changes (``models.attn_implementation`` used to change
every model load while only three stages listed ``models``). The reads are found statically, in the files
``code_deps.stage_code_files`` says the stage runs (the same closure dvc.yaml's code deps are checked
against), by the types the code itself declares:

* a parameter annotated with the pipeline config (``PipelineConfig``) or one of the Protocols that name
  what a floor reads of it (``EvalJobConfig``, ``RLJobConfig``, ...): every ``param.<section>`` read, and
  for ``param.<method>(name)`` what that method of PipelineConfig reads when it is run, on the tiny
  profile's config, with every name the stage can pass it: a method taking a ``stage`` is asked about the
  stage itself, one taking a ``checkpoint`` about the checkpoints the stage decodes, its own and its
  upstream stages' (``engine_settings_of`` reads ``parallel_r1`` only for a Parallel-R1 checkpoint);
* a parameter annotated with one section's own type (``ModelsConfig`` is ``models``, ``GradingConfig`` is
  ``grading``): that section. Types several sections share (``RLStageConfig``, ``SFTStageConfig``) say
  nothing about which one, and the stage's own section is always listed.

Sections that say where and how a stage runs and are recorded, not what it computes (tracking, storage,
orchestration, the nightly gate, the profile's name), are outside the check: ``OUTSIDE_OUTPUTS``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from functools import cache
from pathlib import Path

from components.evaluation.job import EvalJobConfig
from components.tracking import TrackedConfig
from components.training.config import StageSections
from components.training.job import RLJobConfig
from components.training.memory import PlanConfig
from components.training.seed_job import SeedJobConfig
from components.training.warmup import WarmupJobConfig
from tests.support.code_deps import stage_code_files

# Every Protocol standing for PipelineConfig: what the floors below components.config take (it cannot be
# imported there, tests/unit/core/test_floors.py); tests/unit/core/test_config_protocols.py checks each
# against PipelineConfig, and a stage's reads through one are found like reads through PipelineConfig.
PIPELINE_PROTOCOLS: list[type] = [
    StageSections,
    PlanConfig,
    RLJobConfig,
    SeedJobConfig,
    TrackedConfig,
    EvalJobConfig,
    WarmupJobConfig,
]

# Where and how a stage runs, recorded in provenance; changing one does not change a stage's outputs.
OUTSIDE_OUTPUTS = frozenset({"profile", "tracking", "storage", "orchestration", "nightly"})


@cache
def _pipeline_fields() -> dict[str, str]:
    """Section name -> the name of its type where that type is the section's alone (None if shared)."""
    from components.config import PipelineConfig

    owners: dict[str, list[str]] = {}
    for name, field in PipelineConfig.model_fields.items():
        annotation = field.annotation
        type_name = getattr(annotation, "__name__", None)
        if isinstance(annotation, type) and type_name is not None:
            owners.setdefault(type_name, []).append(name)
    return {sections[0]: type_name for type_name, sections in owners.items() if len(sections) == 1}


def _pipeline_types() -> frozenset[str]:
    """Names of the types that stand for the whole pipeline config: PipelineConfig and its Protocols."""
    return frozenset({"PipelineConfig", *(protocol.__name__ for protocol in PIPELINE_PROTOCOLS)})


def _annotation_names(annotation: ast.expr | None) -> set[str]:
    if annotation is None:
        return set()
    return {node.id for node in ast.walk(annotation) if isinstance(node, ast.Name)} | {
        node.attr for node in ast.walk(annotation) if isinstance(node, ast.Attribute)
    } | ({annotation.value} if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str) else set())


def _reads_on(body: ast.AST, names: set[str], fields: set[str], methods: dict[str, set[str]]) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(body):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in names:
            if node.attr in fields:
                found.add(node.attr)
            elif node.attr in methods:
                found |= methods[node.attr]
    return found


class _RecordedSections(Mapping[str, object]):
    def __init__(self, sections: Mapping[str, object], read: set[str]) -> None:
        self._sections, self._read = sections, read

    def __getitem__(self, name: str) -> object:
        value = self._sections[name]
        self._read.add(name)
        return value

    def __iter__(self) -> Iterator[str]:
        return iter(self._sections)

    def __len__(self) -> int:
        return len(self._sections)


class _Recorder:
    """Stands in for ``self`` in a PipelineConfig method: hands out the real sections and notes which."""

    def __init__(self, cfg: object, fields: set[str]) -> None:
        object.__setattr__(self, "_cfg", cfg)
        object.__setattr__(self, "_fields", fields)
        object.__setattr__(self, "read", set())

    def sections(self, kind: type | tuple[type, ...]) -> Mapping[str, object]:
        # the mapping of every section of a kind: only the one looked up is read
        return _RecordedSections(self._cfg.sections(kind), self.read)

    def __getattr__(self, name: str) -> object:
        value = getattr(self._cfg, name)
        if name in self._fields:
            self.read.add(name)
        elif callable(value) and hasattr(type(self._cfg), name):  # another method: runs on the recorder too
            return getattr(type(self._cfg), name).__get__(self)
        return value


@cache
def _tiny_config() -> object:
    from components.config import load_config

    return load_config(profile="tiny")


@cache
def method_reads(method: str, names: tuple[str, ...]) -> frozenset[str]:
    """The sections PipelineConfig's ``method`` reads when called with each of ``names`` (tiny profile)."""
    from components.config import PipelineConfig

    cfg = _tiny_config()
    read: set[str] = set()
    for name in names:
        recorder = _Recorder(cfg, _all_fields())
        getattr(PipelineConfig, method)(recorder, name)
        read |= recorder.read
    return frozenset(read)


@cache
def _name_methods() -> dict[str, str]:
    """PipelineConfig's methods that take a name -> what they take: ``stage`` (``schema_of``, ``section``:
    a stage asks about itself) or ``checkpoint`` (``engine_settings_of``: a stage asks about a checkpoint it
    decodes, its own or an input's)."""
    import inspect

    from components.config import PipelineConfig

    found = {}
    for name, member in vars(PipelineConfig).items():
        if inspect.isfunction(member) and not name.startswith("_"):
            params = list(inspect.signature(member).parameters)
            if len(params) >= 2 and params[1] in {"stage", "checkpoint"}:
                found[name] = params[1]
    return found


@cache
def _all_fields() -> set[str]:
    from components.config import PipelineConfig

    return set(PipelineConfig.model_fields)


def file_config_reads(path: Path, stage: str, checkpoints: tuple[str, ...]) -> set[str]:
    """The sections the functions in ``path`` read when run by ``stage``, which decodes ``checkpoints``
    (see the module docstring for how)."""
    fields = _all_fields()
    by_type = {type_name: section for section, type_name in _pipeline_fields().items()}
    pipeline_types = _pipeline_types()
    names = {"stage": (stage,), "checkpoint": checkpoints}
    methods = {method: method_reads(method, names[takes]) for method, takes in _name_methods().items()}
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        args = [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]
        whole = set()
        for arg in args:
            types = _annotation_names(arg.annotation)
            if types & pipeline_types:
                whole.add(arg.arg)
            found |= {by_type[t] for t in types if t in by_type}
        if whole:
            found |= _reads_on(node, whole, fields, methods)
    return found


def stage_config_reads(stage: str, root: Path = Path(".")) -> set[str]:
    """The config sections ``stage``'s computation reads, less ``OUTSIDE_OUTPUTS``, plus its own section."""
    from components.dag import load_stages

    root = Path(root).resolve()
    files = set(stage_code_files(stage, root)) | {f"components/stages/{stage}.py"}
    checkpoints = (stage, *load_stages()[stage].upstream)
    found: set[str] = {stage} & _all_fields()
    for rel in sorted(files):
        found |= file_config_reads(root / rel, stage, checkpoints)
    return found - OUTSIDE_OUTPUTS
