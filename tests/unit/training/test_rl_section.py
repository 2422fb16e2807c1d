"""An RL stage's runner reads its own section by type (training.config.rl_section), never getattr(cfg, stage)."""

from __future__ import annotations

import pytest

from components.config import load_config, rl_stages
from components.settings import ConfigError
from components.training.config import RLStageConfig, rl_section


def test_every_rl_stage_reads_its_own_typed_section() -> None:
    cfg = load_config(profile="tiny")
    for stage in rl_stages():
        section = rl_section(cfg, stage)
        assert isinstance(section, RLStageConfig) and section is getattr(cfg, stage)


@pytest.mark.parametrize("stage", ["distill", "parallel_warmup", "no_such_stage"])
def test_any_other_name_is_refused_with_the_rl_stages_named(stage: str) -> None:
    cfg = load_config(profile="tiny")
    with pytest.raises(ConfigError, match=f"'{stage}' is not an RL stage; the RL stages are npr_zero, papo_rl"):
        rl_section(cfg, stage)
