"""dvc.yaml is the one DAG: stage modules, CLI commands, params, paths and the Prefect flow derive from it."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest
import yaml

from components.config import load_config
from components.dag import DagError, load_stages, stage_io, stage_order
from components.fingerprint import _param_value, stage_fingerprint


def test_every_stage_is_the_cli_on_its_own_module(in_repo: Path) -> None:
    for name, spec in load_stages().items():
        assert spec.cmd == f"npr stage {name}"
        assert f"components/stages/{name}.py" in spec.deps, f"{name} must depend on its own source"
        module = importlib.import_module(f"components.stages.{name}")
        assert callable(getattr(module, "run", None)), f"components/stages/{name}.py must define run(cfg, io)"


def test_params_exist_in_params_yaml(in_repo: Path) -> None:
    data = load_config().model_dump(mode="json")
    for spec in load_stages().values():
        for key in spec.params:
            _param_value(data, key)


def test_order_respects_dependencies(in_repo: Path) -> None:
    order = stage_order()
    assert sorted(order) == sorted(load_stages())
    for name, spec in load_stages().items():
        for up in spec.upstream:
            assert order.index(up) < order.index(name), f"{up} must run before {name}"
    assert order[0] == "sample_orz" and order[-1] == "evaluate"


def test_stage_io_resolves_inputs_and_outputs(in_repo: Path) -> None:
    io = stage_io("parallel_warmup")
    assert io.input("reject_filter/accepted") == Path("artifacts/reject_filter/accepted")
    assert io.upstream_output("seed", "model") == Path("artifacts/seed/model")
    assert io.output("model") == Path("artifacts/parallel_warmup/model")
    assert io.metrics == Path("artifacts/parallel_warmup/metrics.json")
    with pytest.raises(DagError, match="no input"):
        io.input("papo_rl/model")
    with pytest.raises(DagError, match="unknown stage"):
        stage_io("nope")


def test_init_from_stages_are_declared_inputs(in_repo: Path) -> None:
    cfg = load_config()
    for name in ("npr_zero", "parallel_warmup", "sequential_warmup", "papo_rl", "sr_rl"):
        stage_io(name).upstream_output(getattr(cfg, name).init_from, "model")
    stage_io("distill").upstream_output(cfg.distill.init_from, "model")


def test_fingerprint_changes_with_own_params_only(in_repo: Path) -> None:
    specs = load_stages()
    base = load_config()
    changed = load_config(overrides=["sample_orz.n=11"])
    assert stage_fingerprint(specs["sample_orz"], base) != stage_fingerprint(specs["sample_orz"], changed)
    assert stage_fingerprint(specs["distill"], base) == stage_fingerprint(specs["distill"], changed)


def test_flow_runs_exactly_dvc_stages_in_order(in_repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The Prefect flow's task list equals dvc.yaml's stages (order included)."""
    import flows.pipeline as pipeline

    seen: list[tuple[str, str]] = []

    class Done:  # a finished future
        def result(self):
            return {"metrics": {}, "wall_s": 0.0}

    class Recorder:  # replaces prefect.task: records what the flow would run, in submission order
        def __init__(self, name, version):
            self.name, self.version = name, version

        def submit(self, *args, wait_for=()):
            seen.append((self.name, self.version))
            return Done()

    def record(fn, name, version, **kwargs):
        return Recorder(name, version)

    monkeypatch.setattr(pipeline, "task", record)
    pipeline.npr_pipeline.fn(profile="tiny")
    assert [n for n, _ in seen] == [f"stage-{s}" for s in stage_order()]
    dvc_names = list(yaml.safe_load(Path("dvc.yaml").read_text())["stages"])
    assert sorted(n.removeprefix("stage-") for n, _ in seen) == sorted(dvc_names)
    assert all(len(v) == 16 for _, v in seen)
    timing = json.loads((in_repo / "artifacts" / "pipeline" / "timing-local.json").read_text())
    assert list(timing["stages_wall_s"]) == stage_order() and timing["total_wall_s"] >= 0


def test_code_deps_cover_every_module_a_stage_computes_with(in_repo: Path) -> None:
    # a module a stage runs but does not depend on = a stale output DVC never reruns
    from tests.support.code_deps import stage_code_files, uncovered

    for name, spec in load_stages().items():
        files = stage_code_files(name)
        assert f"components/stages/{name}.py" in files
        assert uncovered(files, spec.deps) == [], f"{name}: dvc.yaml deps miss modules it imports"
        # and no code dep is dead weight (a directory none of the stage's code lives in reruns it for nothing)
        code_deps = [d for d in spec.deps if d.startswith("components")]
        dead = [d for d in code_deps if not any(f == d or f.startswith(d.rstrip("/") + "/") for f in files)]
        assert dead == [], f"{name}: deps on code it never imports: {dead}"


def test_code_closure_follows_lazy_imports_and_stops_at_plumbing(tmp_path: Path) -> None:
    from tests.support.code_deps import stage_code_files

    pkg = tmp_path / "components"
    (pkg / "stages").mkdir(parents=True)
    (pkg / "lib").mkdir()
    for init in (pkg / "__init__.py", pkg / "stages" / "__init__.py", pkg / "lib" / "__init__.py"):
        init.write_text("")
    (pkg / "config.py").write_text("import components.lib.everything\n")  # plumbing: not followed
    (pkg / "lib" / "everything.py").write_text("")
    (pkg / "lib" / "math.py").write_text("from components.lib import helper\n")
    (pkg / "lib" / "helper.py").write_text("")
    (pkg / "stages" / "toy.py").write_text(
        "from components.config import X\n\ndef run():\n    from components.lib.math import f\n"
    )
    assert stage_code_files("toy", tmp_path) == [
        "components/lib/helper.py",
        "components/lib/math.py",
        "components/stages/toy.py",
    ]


def test_every_stage_declares_its_record_flat_metrics_and_plots(in_repo: Path) -> None:
    """artifacts/<stage>/metrics.json (cached out), metrics/<stage>.json (DVC metrics, git-tracked) and, for
    the training stages and evaluate, plots/<stage>/ (git-tracked plot rows)."""
    training = {"seed", "npr_zero", "parallel_warmup", "sequential_warmup", "papo_rl", "sr_rl", "evaluate"}
    training |= {"pr1_coldstart", "pr1_rl"}
    raw = yaml.safe_load(Path("dvc.yaml").read_text())["stages"]
    for name in load_stages():
        io = stage_io(name)
        assert io.metrics == Path(f"artifacts/{name}/metrics.json")
        assert io.summary == (
            Path("metrics/evaluate") if name == "evaluate" else Path(f"metrics/{name}.json")
        )
        assert {str(io.summary): {"cache": False}} in raw[name]["metrics"]
        assert (io.plots == Path(f"plots/{name}")) == (name in training), name
        if io.plots is not None:
            assert {str(io.plots): {"cache": False}} in raw[name]["outs"]
        assert io.work_dir == Path(f"artifacts/{name}/work")
        assert "metrics.json" not in io.outputs and all(
            str(p).startswith("artifacts/") for p in io.outputs.values()
        )


def _param_problems(specs: dict) -> list[str]:
    from tests.support.config_reads import stage_config_reads

    problems = []
    for name, spec in specs.items():
        listed = {key.split(".")[0] for key in spec.params}
        reads = stage_config_reads(name)
        if missing := sorted(reads - listed):
            problems.append(f"{name}: dvc.yaml params miss sections it reads: {missing}")
        if unread := sorted(listed - reads):
            problems.append(f"{name}: dvc.yaml params list sections it never reads: {unread}")
    return problems


def test_params_are_the_sections_each_stage_reads(in_repo: Path) -> None:
    # a section a stage reads but does not list = a stale output `dvc repro` never reruns (models, once)
    assert _param_problems(load_stages()) == []


def test_params_check_fails_when_a_param_is_removed_or_added(in_repo: Path) -> None:
    from dataclasses import replace

    specs = load_stages()
    for stage in ("npr_zero", "distill", "evaluate", "seed"):
        without = replace(specs[stage], params=tuple(p for p in specs[stage].params if p != "models"))
        assert _param_problems({stage: without}) == [
            f"{stage}: dvc.yaml params miss sections it reads: ['models']"
        ]
    extra = replace(specs["reject_filter"], params=(*specs["reject_filter"].params, "grading"))
    assert _param_problems({"reject_filter": extra}) == [
        "reject_filter: dvc.yaml params list sections it never reads: ['grading']"
    ]


def test_config_reads_follow_declared_types(tmp_path: Path, in_repo: Path) -> None:
    from tests.support.config_reads import file_config_reads

    source = tmp_path / "toy.py"
    source.write_text(
        "def whole(cfg: PipelineConfig, n: int) -> None:\n"
        "    cfg.models.attn_implementation\n"
        "    cfg.engine_settings_of(n)\n"
        "def part(grading: GradingConfig | None, other) -> None:\n"
        "    other.prompts\n"  # untyped: says nothing
        "def shared(section: RLStageConfig) -> None:\n"  # a type several sections share: says nothing
        "    section.steps\n"
    )
    assert file_config_reads(source, "npr_zero", ("npr_zero", "seed")) == {"models", "grading"}
    # engine_settings_of reads parallel_r1 for a Parallel-R1 checkpoint only
    assert file_config_reads(source, "pr1_rl", ("pr1_rl", "pr1_coldstart")) == {"models", "grading", "parallel_r1"}
