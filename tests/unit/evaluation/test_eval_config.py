"""The evaluate/nightly config sections, and that they agree with the engine config, dvc.yaml and profiles."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from components.config import load_config, parallel_r1_stages
from components.dag import load_stages, stage_io
from components.engine import GenerationConfig
from components.evaluation.config import BenchmarkSpec, EvaluateConfig
from components.evaluation.plots import ACCURACY_JSON, SPEEDUP_JSON
from components.evaluation.runner import generation_config, sampling_settings
from components.evaluation.spread import spread_path
from components.settings import ConfigError
from components.stages.evaluate import stage_outputs


def test_sampling_settings_are_the_engine_config() -> None:
    ecfg = EvaluateConfig(generation=GenerationConfig(temperature=0.5, top_k=7, max_new_tokens=33))
    gen = generation_config(ecfg, "parallel")
    assert (gen.mode, gen.temperature, gen.top_k, gen.max_new_tokens) == ("parallel", 0.5, 7, 33)
    assert generation_config(ecfg, "sequential").mode == "sequential" and ecfg.generation.mode == "sequential"
    pinned = sampling_settings(ecfg, "reread")
    assert pinned["temperature"] == 0.5 and pinned["top_k"] == 7
    # the trained merge semantics is pinned beside the decode's merge_mode
    assert (pinned["merge_semantics"], pinned["merge_mode"]) == ("reread", "shared_kv")
    assert not {"batch_size", "mode", "server_url"} & set(pinned)


def test_invalid_sections_name_the_problem() -> None:
    with pytest.raises(ValidationError, match="exceeds n_samples"):
        BenchmarkSpec(name="x", n_samples=2, k=4)
    with pytest.raises(ValidationError, match="not in checkpoints"):
        EvaluateConfig(checkpoints=["seed"], parallel_checkpoints=["papo_rl"])
    with pytest.raises(ValidationError, match="unique"):
        EvaluateConfig(benchmarks=[BenchmarkSpec(name="a"), BenchmarkSpec(name="a")])
    with pytest.raises(ValidationError, match="non-smoke"):
        EvaluateConfig(benchmarks=[BenchmarkSpec(name="a", smoke=True)], recipe_benchmark="a")


def test_checkpoint_keys_name_a_checkpoint_or_a_model_stage(in_repo: Path) -> None:
    """prompt_style_overrides and speedup.checkpoints are checked against the pipeline's stage table, where a
    model stage left out of a narrowed run is known, and a typo is not."""
    narrowed = ["evaluate.checkpoints=[seed]", "evaluate.parallel_checkpoints=[]"]
    typo = "evaluate.prompt_style_overrides={sr_lr: sequential}"
    left_out = "evaluate.prompt_style_overrides={sr_rl: sequential}"
    with pytest.raises(ConfigError, match=r"evaluate.prompt_style_overrides \['sr_lr'\]"):
        load_config(profile="tiny", overrides=[*narrowed, typo])
    with pytest.raises(ConfigError, match=r"evaluate.speedup.checkpoints \['papo_r'\]"):
        load_config(profile="tiny", overrides=[*narrowed, "evaluate.speedup.checkpoints=[papo_r]"])
    with pytest.raises(ConfigError, match=r"evaluate.recipe_names \['sr_lr'\]"):
        load_config(profile="tiny", overrides=[*narrowed, "evaluate.recipe_names={sr_lr: SR}", "evaluate.recipe_claims=[]", "evaluate.recipe_subject=null"])
    # A model stage left out of a narrowed run is fine: the override applies when it is evaluated.
    cfg = load_config(profile="tiny", overrides=[*narrowed, left_out])
    assert cfg.evaluate.prompt_style_for("seed") == "parallel"
    assert cfg.evaluate.prompt_style_for("sr_rl") == "sequential"


def test_recipe_claims_and_subject_name_checkpoints_the_recipe_names() -> None:
    with pytest.raises(ValidationError, match=r"recipe_claims and recipe_subject name \['sr_rl'\]"):
        EvaluateConfig(recipe_names={"papo_rl": "NPR"}, recipe_claims=[{"a": "papo_rl", "b": "sr_rl", "relation": "ge"}])
    with pytest.raises(ValidationError, match=r"name \['npr'\]"):
        EvaluateConfig(recipe_names={"papo_rl": "NPR"}, recipe_claims=[], recipe_subject="npr")
    lone = EvaluateConfig(recipe_names={"papo_rl": "NPR"}, recipe_claims=[], recipe_subject=None)
    assert lone.recipe_subject is None


def test_speedup_decode_covers_the_named_parallel_checkpoints() -> None:
    from components.evaluation.runner import CheckpointSpec, _times_speedup

    every = EvaluateConfig(checkpoints=["papo_rl", "pr1_rl"], parallel_checkpoints=["papo_rl"])
    named = every.model_copy(update={"speedup": every.speedup.model_copy(update={"checkpoints": ["papo_rl"]})})
    par = [CheckpointSpec(n, Path(n), "parallel") for n in ("papo_rl", "pr1_rl")]
    seq = CheckpointSpec("sr_rl", Path("sr_rl"), "sequential")
    assert [_times_speedup(every, c) for c in [*par, seq]] == [True, True, False]
    assert [_times_speedup(named, c) for c in [*par, seq]] == [True, False, False]
    off = every.model_copy(update={"measure_speedup": False})
    assert not any(_times_speedup(off, c) for c in par)


@pytest.mark.parametrize("profile", ["tiny", "qwen3-4b"])
def test_profiles_are_consistent(profile: str, in_repo: Path) -> None:
    cfg = load_config(profile=profile)
    names = [b.name for b in cfg.evaluate.benchmarks]
    assert set(cfg.nightly.benchmarks or names) <= set(names)
    assert cfg.nightly.checkpoint in cfg.evaluate.checkpoints
    # Each trained checkpoint is evaluated with the instruction its stage trained on, in its schema, and a
    # checkpoint trained with the parallel mask decodes in parallel.
    for name in cfg.evaluate.checkpoints:
        section = getattr(cfg, name)
        assert cfg.prompt_style_of(name) == getattr(section, "prompt_style", "parallel"), name
        assert cfg.schema_of(name) == (getattr(section, "SCHEMA", None) or cfg.schema_name), name
        trained_mode = getattr(section, "mode", getattr(section, "engine_mode", None))
        if trained_mode == "parallel":
            assert cfg.decode_mode_of(name) == "parallel", name
    for name in parallel_r1_stages():
        assert name in cfg.evaluate.checkpoints
        assert cfg.decode_mode_of(name) == cfg.parallel_r1.mode
        # Parallel-R1's evaluation budget (its whole-problem paths) is its RL stage's rollout budget, and
        # it is given to the evaluation's decode only (the RL stage has its own max_new_tokens)
        budget = cfg.parallel_r1.max_new_tokens
        evaluation = cfg.engine_settings_of(name, evaluation=True)
        assert evaluation.get("max_new_tokens") == budget and "max_new_tokens" not in cfg.engine_settings_of(name)
        if budget is not None:
            assert cfg.pr1_rl.max_new_tokens == budget
    io = stage_io("evaluate")
    for name in cfg.evaluate.checkpoints:
        io.input(f"{name}/model")  # raises if dvc.yaml does not declare it


def test_plot_files_are_the_ones_dvc_yaml_declares(in_repo: Path) -> None:
    dvc = yaml.safe_load(Path("dvc.yaml").read_text())
    out = stage_outputs(stage_io("evaluate"))
    assert {"plots/evaluate": {"cache": False}} in dvc["stages"]["evaluate"]["outs"]
    bars = {
        next(iter(d["x"])): (next(iter(d["x"].values())), next(iter(d["y"].values())))
        for item in dvc["plots"]
        for d in item.values()
        if d.get("template") == "bar_horizontal"
    }
    # categorical bars: the value on x, the checkpoint name on y
    assert bars == {
        str(out.plots_dir / ACCURACY_JSON): ("accuracy", "checkpoint"),
        str(out.plots_dir / SPEEDUP_JSON): ("achieved_speedup", "checkpoint"),
    }


def test_the_profiles_name_a_spread_file_the_evaluate_stage_depends_on(in_repo: Path) -> None:
    deps = [d.rstrip("/") for d in load_stages()["evaluate"].deps]
    for profile in ("tiny", "qwen3-4b"):
        setting = load_config(profile=profile).evaluate.seed_spread
        for precision in ("bfloat16", "float32"):
            path = spread_path(setting, precision)
            if path is None:
                continue
            # DVC reruns evaluate when the file changes and needs no file to run (its directory is the dep)
            assert any(Path(path).is_relative_to(d) and Path(d).is_dir() for d in deps), path
    # one committed spread per training precision (issue 43); the bf16 one is committed
    assert load_config(profile="tiny").evaluate.seed_spread == "eval/seed_spread/tiny-{precision}.json"
    assert Path(spread_path(load_config(profile="tiny").evaluate.seed_spread, "bfloat16")).is_file()
    assert load_config(profile="qwen3-4b").evaluate.seed_spread is None
