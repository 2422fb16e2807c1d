"""EvalJobConfig lists exactly the attributes ``eval_job`` reads of ``cfg`` (that PipelineConfig has each of
them, with the declared type, is tests/unit/core/test_config_protocols.py); below the builder, the runner,
``evaluate_into`` and ``npr eval`` read the job, never the config (issue 45)."""

from __future__ import annotations

import ast
import dataclasses
import os
from pathlib import Path

import pytest

import components.evaluation.adhoc as adhoc
import components.evaluation.job as job_module
import components.evaluation.outputs as outputs
import components.evaluation.runner as runner
from components.evaluation.job import EvalJobConfig, eval_job

REPO = Path(__file__).resolve().parents[3]


def declared_members(proto: type) -> list[str]:
    """A protocol's own public members: its properties, methods and annotated attributes."""
    names = [name for name in vars(proto) if not name.startswith("_")]
    return names + [name for name in vars(proto).get("__annotations__", {}) if name not in names]


def cfg_reads(module: object) -> set[str]:
    tree = ast.parse(Path(getattr(module, "__file__", "") or "").read_text())
    return {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "cfg"
    }


def test_eval_job_config_lists_what_the_builder_reads_of_cfg() -> None:
    assert set(declared_members(EvalJobConfig)) == cfg_reads(job_module)


def test_below_the_builder_nothing_reads_the_config() -> None:
    for module in (runner, outputs, adhoc):
        assert cfg_reads(module) == set(), module.__name__


def test_the_job_resolves_each_checkpoints_decoding_once() -> None:
    from components.config import load_config

    cwd = os.getcwd()
    os.chdir(REPO)  # prompt files are read relative to the repository root
    try:
        cfg = load_config(profile="tiny")
    finally:
        os.chdir(cwd)
    job = eval_job(cfg)
    assert list(job.decoding) == cfg.evaluate.checkpoints
    assert {how.mode for how in job.decoding.values()} == {"parallel", "sequential"}
    for name, how in job.decoding.items():
        assert how.mode == cfg.decode_mode_of(name)
        assert how.prompt_style == cfg.prompt_style_of(name)
        assert how.schema == cfg.schema_of(name)
        assert dict(how.engine_settings) == cfg.engine_settings_of(name, evaluation=True)
    with pytest.raises(KeyError, match="without checkpoint 'nope'"):
        job.decode_of("nope")
    with pytest.raises(dataclasses.FrozenInstanceError):
        job.schema = "other"  # type: ignore[misc]
    # a served checkpoint's URL: the job with another generation section, everything else the same
    served = job.with_generation(job.section.generation.model_copy(update={"max_new_tokens": 7}))
    assert served.section.generation.max_new_tokens == 7
    assert job.section is cfg.evaluate  # the job's own section is untouched
    assert dataclasses.replace(served, section=job.section) == job
