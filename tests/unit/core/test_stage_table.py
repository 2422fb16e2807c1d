"""One stage table: stage names live in dvc.yaml and in PipelineConfig's sections, nowhere else.

Code outside ``components/stages/`` that needs a set of stages derives it from the sections' types
(``components.config.sections_of``) or from dvc.yaml (``components.dag``); a literal list of stage names
there is a second definition that drifts when a stage is added (issue 29), so this test refuses it.
"""

from __future__ import annotations

import ast
from pathlib import Path

from components import dag
from components.config import (
    PipelineConfig,
    decode_stages,
    model_stages,
    parallel_r1_stages,
    pipeline_stages,
    rl_stages,
    sft_stages,
)
from components.dag import load_stages
from components.engine.config import DistillConfig
from components.evaluation.config import EvaluateConfig
from components.training.config import PR1ColdStartConfig, PR1RLConfig, RLStageConfig, SFTStageConfig

REPO = Path(__file__).resolve().parents[3]
SCANNED = ("components", "flows", "benchmarks")
EXEMPT = (Path("components") / "stages",)  # the stage functions themselves are named by their stage


def _string_constants(nodes: list[ast.expr | None]) -> list[str] | None:
    """The strings of ``nodes`` when every one is a string constant, else None."""
    out = []
    for node in nodes:
        if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
            return None
        out.append(node.value)
    return out


def _setting_defaults(tree: ast.Module) -> set[int]:
    """The default values of the typed config's fields (``field: T = [...]`` in a class body of a config
    module): a setting's value, as configs/*.yaml give it (``evaluate.parallel_checkpoints``), not a table."""
    return {
        id(stmt.value)
        for cls in tree.body
        if isinstance(cls, ast.ClassDef)
        for stmt in cls.body
        if isinstance(stmt, ast.AnnAssign)
        and stmt.value is not None
        and "ClassVar" not in ast.unparse(stmt.annotation)  # a class constant is a table, not a setting
    }


def stage_name_lists(root: Path, stages: set[str]) -> list[str]:
    """``file:line`` of every tuple/list/set literal, or dict's keys, of 2+ strings that are all stage names."""
    found = []
    for top in SCANNED:
        for path in sorted((root / top).rglob("*.py")):
            rel = path.relative_to(root)
            if any(rel.is_relative_to(e) for e in EXEMPT):
                continue
            tree = ast.parse(path.read_text(), filename=str(rel))
            settings = _setting_defaults(tree) if path.name == "config.py" else set()
            for node in sorted(ast.walk(tree), key=lambda n: getattr(n, "lineno", 0)):
                if id(node) in settings:
                    continue
                if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
                    names = _string_constants(list(node.elts))
                elif isinstance(node, ast.Dict):
                    names = _string_constants(list(node.keys))
                else:
                    continue
                if names and len(names) >= 2 and set(names) <= stages:
                    found.append(f"{rel}:{node.lineno}: {', '.join(names)}")
    return found


def test_no_list_of_stage_names_outside_the_stage_table() -> None:
    stages = set(load_stages(REPO / "dvc.yaml"))
    found = stage_name_lists(REPO, stages)
    assert not found, (
        "stage names listed outside dvc.yaml and PipelineConfig's sections; derive them from the sections' "
        "types (components.config.sections_of) or from dvc.yaml (components.dag):\n" + "\n".join(found)
    )


def test_the_config_sections_are_dvc_yamls_stages_in_its_order() -> None:
    assert list(pipeline_stages()) == list(load_stages(REPO / "dvc.yaml"))


def test_stage_kinds_follow_the_section_types() -> None:
    fields = PipelineConfig.model_fields
    for name in rl_stages():
        assert issubclass(fields[name].annotation, RLStageConfig), name
    for name in sft_stages():
        assert issubclass(fields[name].annotation, SFTStageConfig), name
    for name in decode_stages():
        assert issubclass(fields[name].annotation, (DistillConfig, EvaluateConfig)), name
    assert {fields[n].annotation for n in parallel_r1_stages()} == {PR1ColdStartConfig, PR1RLConfig}
    # the kinds do not overlap: a stage is planned, launched and reported one way
    kinds = [set(rl_stages()), set(sft_stages()), set(decode_stages())]
    assert sum(len(k) for k in kinds) == len(set().union(*kinds))


def test_the_check_flags_a_literal_list(tmp_path: Path) -> None:
    (tmp_path / "components").mkdir()
    source = 'A = ("seed", "npr_zero")\nB = {"seed": 1, "evaluate": 2}\n'
    (tmp_path / "components" / "x.py").write_text(source)
    # a config field's default is a setting; a module-level list in a config module is a table
    setting = (
        'class C:\n    checkpoints: list[str] = ["seed", "npr_zero"]\n'
        '    S: ClassVar[tuple] = ("seed", "npr_zero")\nT = ["seed", "npr_zero"]\n'
    )
    (tmp_path / "components" / "config.py").write_text(setting)
    (tmp_path / "components" / "stages").mkdir()
    (tmp_path / "components" / "stages" / "y.py").write_text('A = ("seed", "npr_zero")\n')
    found = stage_name_lists(tmp_path, {"seed", "npr_zero", "evaluate"})
    assert found == [
        "components/config.py:3: seed, npr_zero",
        "components/config.py:4: seed, npr_zero",
        "components/x.py:1: seed, npr_zero",
        "components/x.py:2: seed, evaluate",
    ]


def test_the_model_stages_are_the_sections_that_train_and_the_outs_that_are_models() -> None:
    # by type (seed, SFT, RL sections) and by dvc.yaml (an artifacts/<stage>/model out): the same stages
    assert set(model_stages()) == set(dag.model_stages(REPO / "dvc.yaml"))


def test_branch_order_finishes_a_branch_before_the_next() -> None:
    order = dag.model_stages(REPO / "dvc.yaml")
    assert order == [
        "seed",
        "npr_zero",
        "parallel_warmup",
        "papo_rl",
        "sequential_warmup",
        "sr_rl",
        "pr1_coldstart",
        "pr1_rl",
    ]
    specs = load_stages(REPO / "dvc.yaml")
    full = dag.branch_order(specs)
    for name in specs:  # a topological order all the same
        assert all(full.index(u) < full.index(name) for u in specs[name].upstream if u in specs)
    chain = dag.chain_to("papo_rl", REPO / "dvc.yaml")
    assert chain[-1] == "papo_rl" and set(chain) == dag.ancestors(specs, "papo_rl") | {"papo_rl"}
