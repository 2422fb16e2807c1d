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

# every profile file, overlays included (configs/*.yaml)
PROFILES = sorted(p.stem for p in (Path(__file__).resolve().parents[3] / "configs").glob("*.yaml"))


@pytest.mark.parametrize("profile", PROFILES)
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


@pytest.mark.parametrize(
    "override, key",
    [
        ("npr_zero.steps=true", "npr_zero.steps"),  # a bool is not 1
        ("seed.enabled=1", "seed.enabled"),  # 1 is not True
        ("npr_zero.lr='1e-4'", "npr_zero.lr"),  # a quoted string is not a number
        ("sample_orz.synthetic_weights.easy=true", "sample_orz.synthetic_weights.easy"),
        ("orchestration.task_timeout_s.seed=true", "orchestration.task_timeout_s.seed"),
    ],
)
def test_types_are_strict(in_repo: Path, override: str, key: str) -> None:
    with pytest.raises(ConfigError, match=rf"{key}: Input should be a valid"):
        load_config(profile="tiny", overrides=[override])


def test_numbers_read_as_yaml_1_2_and_dvc_write_them(in_repo: Path) -> None:
    # `dvc exp run -S npr_zero.lr=1e-4` (README): PyYAML alone reads 1e-4 as a string
    assert load_config(profile="tiny", overrides=["npr_zero.lr=1e-4"]).npr_zero.lr == 1e-4
    assert load_config(profile="tiny", overrides=["seed.adam_betas=[0.9, 0.99]"]).seed.adam_betas == (
        0.9,
        0.99,
    )


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["npr_zero.max_new_tokens=600"],
            r"npr_zero\.max_new_tokens=600 leaves no room .*max_position_embeddings=512",
        ),
        (["distill.generation.max_new_tokens=512"], r"distill\.generation\.max_new_tokens=512"),
        (["parallel_warmup.max_length=1024"], r"parallel_warmup\.max_length=1024 exceeds"),
        (
            ["papo_rl.structural_filter=false"],
            r"papo_rl\.engine_mode 'parallel' needs papo_rl\.structural_filter",
        ),
        (
            ["prompts.parallel_instruction=prompts/missing.txt"],
            r"prompts\.parallel_instruction: file prompts/missing",
        ),
        (
            ["orchestration.gpu_stages=[parallel_warmup]", "parallel_warmup.nproc_per_node=16"],
            r"parallel_warmup\.nproc_per_node=16 but a job of the gpu pool gets 8 GPUs",
        ),
    ],
)
def test_cross_field_checks_name_their_keys(in_repo: Path, overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(profile="tiny", overrides=overrides)


def test_malformed_yaml_names_the_file_and_line(tmp_path: Path, in_repo: Path) -> None:
    bad = tmp_path / "params.yaml"
    bad.write_text("profile: tiny\nrun:\n  seed: [0\n")
    with pytest.raises(ConfigError, match=rf"{bad}: line \d+, column \d+: not valid YAML"):
        load_config(bad)
    with pytest.raises(ConfigError, match=r"override 'npr_zero.lr=\[1,': line 1"):
        load_config(profile="tiny", overrides=["npr_zero.lr=[1,"])
    with pytest.raises(ConfigError, match=r"npr_zero\.steps is a value, not a section"):
        load_config(profile="tiny", overrides=["npr_zero.steps.x=3"])


def test_an_error_is_one_line(in_repo: Path) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(profile="tiny", overrides=["npr_zero.steps=true", "seed.lr=-1"])
    text = str(err.value)
    assert "\n" not in text and "configs/tiny.yaml" in text and "npr_zero.steps" in text and "seed.lr" in text
