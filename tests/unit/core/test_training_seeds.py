"""Training-seed overrides (issue 27): every seed that drives training, found in the typed sections."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from components.config import (
    load_config,
    parse_override,
    rl_stages,
    sft_stages,
    training_seed_overrides,
    training_seeds,
)


def _value(cfg: Any, key: str) -> Any:
    node = cfg
    for part in key.split("."):
        node = getattr(node, part)
    return node


def test_every_training_seed_of_the_tiny_profile_and_nothing_else(in_repo: Path) -> None:
    keys = set(training_seeds(load_config(profile="tiny")))
    expected = {f"{s}.seed" for s in (*rl_stages(), *sft_stages())}
    # the run's torch seed, distillation's sampling, Parallel-R1's data selection (found by walking the models)
    expected |= {"run.seed", "distill.generation.seed", "pr1_coldstart.data.seed", "pr1_rl.problems.seed"}
    assert keys == expected
    # the problems, the committed seed model's recipe and the evaluation's sampling stay as they are
    assert "sample_orz.seed" not in keys and "evaluate.generation.seed" not in keys
    assert not any(k.startswith(("seed.", "sample_orz.", "evaluate.")) for k in keys)


def test_overrides_shift_each_seed_by_the_offset_and_validate(in_repo: Path) -> None:
    base = load_config(profile="tiny")
    assert training_seed_overrides(base, 0) == []
    overrides = training_seed_overrides(base, 2)
    assert len(overrides) == len(training_seeds(base))
    shifted = load_config(profile="tiny", overrides=overrides)
    for text in overrides:
        path, value = parse_override(text)
        key = ".".join(path)
        assert value == _value(base, key) + 2, key
        assert _value(shifted, key) == value, key
    assert shifted.parallel_warmup.seed == 523 and shifted.npr_zero.seed == 2  # 521 and 0 on the profile
    for key in ("sample_orz.seed", "evaluate.generation.seed"):
        assert _value(shifted, key) == _value(base, key)
    assert shifted.seed == base.seed


def test_run_seed_stays_when_the_seed_stage_builds_from_it(in_repo: Path) -> None:
    # models.base_model: tiny builds the seed model from run.seed; its recipe is not a training seed
    cfg = load_config(profile="tiny", overrides=["models.base_model=tiny"])
    assert "run.seed" not in training_seeds(cfg)
    assert "npr_zero.seed" in training_seeds(cfg)


def test_a_negative_offset_is_refused(in_repo: Path) -> None:
    with pytest.raises(ValueError, match="offset"):
        training_seed_overrides(load_config(profile="tiny"), -1)
