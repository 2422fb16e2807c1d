from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from components.config import (
    ConfigError,
    apply_overrides,
    dump_yaml,
    load_config,
    materialise_profile,
    validate_config,
)


@pytest.mark.parametrize("profile", ["tiny", "qwen3-4b"])
def test_profiles_validate(in_repo: Path, profile: str) -> None:
    cfg = load_config(profile=profile)
    assert cfg.profile == profile


def test_qwen_profile_has_paper_settings(in_repo: Path) -> None:
    cfg = load_config(profile="qwen3-4b")
    assert cfg.models.base_model == "Qwen/Qwen3-4B-Instruct-2507"
    assert cfg.sample_orz.n == 8000
    assert cfg.npr_zero.max_new_tokens == 30000 and cfg.npr_zero.lr == 1e-6
    assert cfg.papo_rl.lr == 1e-7 and cfg.papo_rl.algorithm == "papo"
    assert cfg.parallel_warmup.lr == 1e-6 and cfg.parallel_warmup.min_lr == 5e-7


def test_params_yaml_is_the_materialised_tiny_profile(in_repo: Path) -> None:
    # params.yaml is committed; it must equal what `npr config use tiny` writes.
    assert Path("params.yaml").read_text() == dump_yaml(load_config(profile="tiny"))


def _tiny_data() -> dict:
    return yaml.safe_load(Path("configs/tiny.yaml").read_text())


def test_unknown_key_names_its_path(in_repo: Path) -> None:
    data = _tiny_data()
    data["sample_orz"]["nn"] = 3
    with pytest.raises(ConfigError, match=r"sample_orz\.nn"):
        validate_config(data)


def test_wrong_type_names_its_path(in_repo: Path) -> None:
    data = _tiny_data()
    data["npr_zero"]["group_size"] = "eight"
    with pytest.raises(ConfigError, match=r"npr_zero\.group_size"):
        validate_config(data)


def test_out_of_range_names_its_path(in_repo: Path) -> None:
    data = _tiny_data()
    data["sample_orz"]["min_kept_fraction"] = 1.5
    with pytest.raises(ConfigError, match=r"sample_orz\.min_kept_fraction"):
        validate_config(data)


def test_nested_out_of_range(in_repo: Path) -> None:
    with pytest.raises(ConfigError, match=r"distill\.generation\.top_p"):
        load_config(profile="tiny", overrides=["distill.generation.top_p=0"])


def test_overrides_keep_yaml_types(in_repo: Path) -> None:
    cfg = load_config(
        profile="tiny", overrides=["sample_orz.n=123", "seed.enabled=false", "run.dtype=bfloat16"]
    )
    assert cfg.sample_orz.n == 123 and cfg.seed.enabled is False and cfg.run.dtype == "bfloat16"


def test_malformed_override_is_rejected() -> None:
    with pytest.raises(ConfigError, match="key.path=value"):
        apply_overrides({}, ["sample_orz.n"])


def test_unknown_profile_lists_known(in_repo: Path) -> None:
    with pytest.raises(ConfigError, match="qwen3-4b"):
        load_config(profile="nope")


def test_materialise_writes_params(tmp_path: Path, in_repo: Path) -> None:
    dest = tmp_path / "params.yaml"
    cfg = materialise_profile("tiny", ["sample_orz.n=77"], dest=dest)
    assert cfg.sample_orz.n == 77
    assert validate_config(yaml.safe_load(dest.read_text())).sample_orz.n == 77
