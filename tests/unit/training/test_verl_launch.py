"""The verl job: every generated override set composes with the installed verl's packaged Hydra config, and
verl's own validation accepts the job (``validate_job`` of the built job) for both profiles and every RL stage
(NPR's three, Parallel-R1's ``pr1_rl`` in both its Unseen and Seen variants); the stage builds its job once."""

from __future__ import annotations

import collections
import json
import shlex
from pathlib import Path

import pytest
import yaml
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf
from verl.trainer.config import AlgoConfig
from verl.utils.config import omega_conf_to_dataclass

from components.config import ConfigError, load_config, rl_stages
from components.training.job import rl_job
from components.training.verl.job import (
    PLUGIN_MODULE,
    VerlRunInputs,
    build_job,
    build_overrides,
    ray_job_command,
    write_job_files,
)
from components.training.verl.launch import launch
from components.training.verl.validate import VerlJobCheck, compose_verl_config
from components.training.verl.validate import validate_job as validate_built_job

INPUTS = VerlRunInputs("/models/seed", "/data/train.parquet", "/data/val.parquet", "/runs/x")
STAGES = list(rl_stages())  # every RL section (by type), as the launcher accepts them


def _prepare(stage: str, cfg, model: Path, problems: Path, run_dir: Path, train_problems=None):
    """What the stage does before it runs verl (``verl.stage.run_verl_stage``): the verl job built from the
    stage's job, validated, its inputs written; returns (the job, its ``verl_overrides.yaml``)."""
    from components.training.verl.stage import prepare_job  # lazy: as in the tests below, where one runs it

    job = build_job(stage, cfg, model_path=model, run_dir=run_dir)
    return job, prepare_job(job, problems, train_problems)


def validate_job(stage: str, cfg) -> VerlJobCheck:
    """verl's validation of ``stage``'s job as ``build_job`` builds it from ``cfg`` (the stage and `npr verl
    launch` do the same)."""
    return validate_built_job(build_job(stage, cfg))


@pytest.mark.parametrize("profile", ["tiny", "qwen3-4b"])
@pytest.mark.parametrize("stage", STAGES)
def test_overrides_compose_with_installed_verl(profile: str, stage: str):
    cfg = load_config(profile=profile)
    stage_cfg = getattr(cfg, stage)
    composed = compose_verl_config(build_overrides(stage, stage_cfg, INPUTS, "npr"))
    actor = composed.actor_rollout_ref.actor
    assert actor.clip_ratio_low == stage_cfg.clip_ratio_low
    assert actor.clip_ratio_high == stage_cfg.clip_ratio_high
    assert composed.actor_rollout_ref.rollout.n == stage_cfg.group_size
    assert composed.reward.custom_reward_function.path == "pkg://components.grading.verl_reward"
    assert composed.reward.custom_reward_function.name == "compute_score"
    assert composed.reward.reward_kwargs.max_resp_len == stage_cfg.max_new_tokens
    # every stage: the tag-keeping reward manager, our plugins imported by the workers
    assert composed.reward.reward_manager.name == "npr"
    assert composed.actor_rollout_ref.model.external_lib == PLUGIN_MODULE
    algo = omega_conf_to_dataclass(composed.algorithm)
    assert isinstance(algo, AlgoConfig)
    rollout = composed.actor_rollout_ref.rollout
    if stage_cfg.algorithm == "papo":
        assert (composed.algorithm.adv_estimator, actor.policy_loss.loss_mode) == ("papo", "papo")
        assert composed.algorithm.rollout_correction.bypass_mode is True
        assert composed.algorithm.filter_groups.enable is False
        assert rollout.agent.default_agent_loop == "npr_parallel" and rollout.calculate_log_probs is True
        assert composed.actor_rollout_ref.model.use_remove_padding is False
        assert actor.policy_loss.rollout_correction.rollout_is == "token"
        assert (
            actor.policy_loss.rollout_correction.rollout_is_threshold
            == stage_cfg.rollout_correction.is_threshold
        )
    elif stage == "pr1_rl":
        # Parallel-R1 (Unseen): GRPO on native parallel rollouts, trained with the canonical mask
        assert (composed.algorithm.adv_estimator, actor.policy_loss.loss_mode) == ("grpo", "vanilla")
        assert composed.algorithm.filter_groups.enable is False
        assert composed.algorithm.rollout_correction.bypass_mode is False
        assert rollout.agent.default_agent_loop == "npr_parallel" and rollout.calculate_log_probs is True
        assert composed.actor_rollout_ref.model.use_remove_padding is False
        assert composed.data.max_response_length == stage_cfg.max_new_tokens + 1
    else:
        assert (composed.algorithm.adv_estimator, actor.policy_loss.loss_mode) == ("grpo", "vanilla")
        assert composed.algorithm.filter_groups.enable is stage_cfg.dynamic_sampling
        assert composed.algorithm.rollout_correction.bypass_mode is False
        assert rollout.agent.default_agent_loop == "single_turn_agent"


def test_parallel_r1_paper_settings_reach_verl():
    """qwen3-4b's pr1_rl carries the paper's run (rl_exp_s2.sh, npr-reference.md §3.5)."""
    cfg = load_config(profile="qwen3-4b")
    composed = compose_verl_config(build_overrides("pr1_rl", cfg.pr1_rl, INPUTS, "npr"))
    actor, rollout = composed.actor_rollout_ref.actor, composed.actor_rollout_ref.rollout
    assert composed.algorithm.adv_estimator == "grpo" and composed.algorithm.norm_adv_by_std_in_grpo is True
    assert (composed.data.train_batch_size, rollout.n, actor.optim.lr) == (256, 8, 1e-6)
    assert (composed.data.max_prompt_length, cfg.pr1_rl.max_new_tokens) == (2000, 3000)
    assert (actor.clip_ratio_low, actor.clip_ratio_high, actor.ppo_mini_batch_size) == (0.2, 0.28, 128)
    assert (actor.use_kl_loss, composed.algorithm.use_kl_in_reward) == (False, False)
    assert (rollout.temperature, rollout.top_p, rollout.val_kwargs.n) == (1.0, 1.0, 1)
    assert cfg.pr1_rl.reward == "accuracy_parallel_interv" and cfg.parallel_r1.paths == 2
    assert cfg.parallel_r1.max_path_tokens == 4096 and cfg.pr1_rl.problems.source == "local"


def test_paper_stage1_settings_reach_verl():
    cfg = load_config(profile="qwen3-4b")
    c = compose_verl_config(build_overrides("npr_zero", cfg.npr_zero, INPUTS, "npr"))
    assert c.data.train_batch_size == 32 and c.actor_rollout_ref.rollout.n == 16
    assert c.data.max_response_length == 30000 and c.actor_rollout_ref.actor.optim.lr == 1e-6
    assert c.actor_rollout_ref.actor.optim.lr_scheduler_type == "cosine"
    # verl's v1 buffer ignores max_num_gen_batches; the bounded replay buffer enforces it: 9 more batches
    assert c.algorithm.filter_groups.max_num_gen_batches == 10
    sampler = c.trainer.v1.sampler
    assert sampler.custom_sampler.name == "BoundedReplayBuffer"
    assert (sampler.sampler_kwargs.dapo_metric, sampler.sampler_kwargs.max_dapo_evictions) == ("reward", 9 * 32)
    assert OmegaConf.to_container(c.reward.reward_kwargs.overlong_buffer_cfg) == {
        "enable": True,
        "len": 10,
        "penalty_factor": 1.0,
        "log": True,
    }


def test_an_unknown_key_fails_composition():
    cfg = load_config(profile="tiny")
    overrides = build_overrides("npr_zero", cfg.npr_zero, INPUTS, "npr") + [
        "actor_rollout_ref.actor.no_such_key=1"
    ]
    with pytest.raises(ConfigCompositionException):
        compose_verl_config(overrides)


def test_ray_job_command_imports_plugins_and_files_are_written(tmp_path):
    # a stage submitted to a running Ray cluster (the profile's own-head form is checked at the end)
    on_cluster = [f"{s}.verl.ray_address=http://head:8265" for s in ("papo_rl", "npr_zero")]
    cfg = load_config(profile="qwen3-4b", overrides=on_cluster)
    job = build_job("papo_rl", cfg, model_path="/models/seed", run_dir=tmp_path / "run")
    argv = ray_job_command(job)
    assert argv[:3] == ["ray", "job", "submit"] and f"--submission-id={job.job_id}" in argv
    env = json.loads(next(a for a in argv if a.startswith("--runtime-env-json=")).split("=", 1)[1])
    assert env["env_vars"]["VERL_USE_EXTERNAL_MODULES"] == PLUGIN_MODULE
    assert env["env_vars"]["VERL_ENGINE_VENDOR"] == "npr" and env["env_vars"]["NPR_SCHEMA"] == "npr"
    assert argv[argv.index("--") + 1 : argv.index("--") + 4] == ["python", "-m", "verl.trainer.main_ppo"]
    problems = [{"id": "p1", "problem": "Compute 1 + 2.", "answer": "3"}]
    path = write_job_files(job, problems, problems)
    saved = yaml.safe_load(path.read_text())
    assert saved["overrides"] == job.overrides and "verl.trainer.main_ppo" in saved["command"]
    dapo_argv = ray_job_command(build_job("npr_zero", cfg))
    dapo_env = json.loads(next(a for a in dapo_argv if a.startswith("--runtime-env-json=")).split("=", 1)[1])
    # DAPO stages import the plugins too (the tag-keeping reward manager) but keep verl's stock actor
    assert dapo_env["env_vars"]["VERL_USE_EXTERNAL_MODULES"] == PLUGIN_MODULE
    assert "VERL_ENGINE_VENDOR" not in dapo_env["env_vars"]
    # ray_address null (the profile): the driver as the stage runs it against the head it starts
    own = ray_job_command(build_job("papo_rl", load_config(profile="qwen3-4b")))
    assert own[0] == "env" and "VERL_ENGINE_VENDOR=npr" in own
    assert own[own.index("python") : own.index("python") + 3] == ["python", "-m", "verl.trainer.main_ppo"]


def test_rows_carry_the_stage_reward_to_compute_score(tmp_path):
    """papo_rl rows make verl score with stage3 (broken structure filtered), npr_zero rows with stage1."""
    import pandas as pd

    from components.config import load_config
    from components.grading.verl_reward import compute_score
    from components.training.verl.job import reward_settings, write_verl_parquet

    cfg = load_config(profile="tiny")
    problems = [{"id": "p1", "problem": "Compute (1 + 2) + (3 + 4).", "answer": "10", "source": "synthetic"}]
    # an unclosed step: no attention mask can be built, so stage3 filters it and stage1 penalises it
    broken = "<guideline><plan>1: add</plan></guideline><step>1: 1 + 2 + 3 + 4 = 10 \\boxed{10}."
    verdicts = {}
    for stage in ("papo_rl", "npr_zero"):
        path = tmp_path / f"{stage}.parquet"
        write_verl_parquet(problems, path, cfg.prompts, "parallel", reward_settings(getattr(cfg, stage), cfg.grading, cfg.schema_name))
        row = pd.read_parquet(path).iloc[0]
        verdicts[stage] = compute_score(
            row["data_source"],
            broken,
            row["reward_model"]["ground_truth"],
            extra_info=dict(row["extra_info"]),
        )
    assert verdicts["papo_rl"]["filtered"] is True and verdicts["papo_rl"]["acc"]
    assert verdicts["npr_zero"]["filtered"] is False and verdicts["npr_zero"]["score"] < 0


@pytest.mark.parametrize("profile", ["tiny", "qwen3-4b"])
@pytest.mark.parametrize("stage", STAGES)
def test_verl_accepts_every_rl_job(profile: str, stage: str):
    """verl's validate_config (as main_ppo calls it) passes, and every plugin the job names resolves."""
    cfg = load_config(profile=profile)
    check = validate_job(stage, cfg)
    assert check.reward_manager_class.endswith("TagKeepingRewardManager")
    assert check.reward_function == "pkg://components.grading.verl_reward:compute_score"
    if stage == "papo_rl":
        assert check.native_parallel
        assert check.engine_class.endswith("NPRParallelEngine") and check.agent_loop == "npr_parallel"
        assert check.agent_loop_class.endswith("NPRParallelAgentLoop")
        assert (check.policy_loss, check.adv_estimator) == ("papo", "papo") and check.bypass_mode
        assert (check.remove_padding, check.ulysses_sp, check.attn_implementation) == (False, 1, "sdpa")
        assert check.post_merge_is_threshold == cfg.papo_rl.rollout_correction.is_threshold
        assert check.env_vars["NPR_SCHEMA"] == "npr"
    elif stage == "pr1_rl":
        assert cfg.parallel_r1.attention == "unseen" and check.native_parallel
        assert check.engine_class.endswith("NPRParallelEngine") and check.agent_loop == "npr_parallel"
        assert (check.policy_loss, check.adv_estimator, check.bypass_mode) == ("vanilla", "grpo", False)
        assert check.post_merge_is_threshold == cfg.pr1_rl.rollout_correction.is_threshold
        assert check.env_vars["NPR_SCHEMA"] == "parallel_r1"
    else:
        assert not check.native_parallel
        assert check.engine_class.endswith("FSDPEngineWithLMHead") and check.agent_loop == "single_turn_agent"


@pytest.mark.parametrize("profile", ["tiny", "qwen3-4b"])
def test_verl_accepts_the_seen_parallel_r1_job(profile: str):
    """Seen: sequential rollouts by verl's own single-turn loop, the stock (causal) actor; the scheduled
    reward gets its step from the tag-keeping reward manager (test_verl_reward)."""
    cfg = load_config(profile=profile, overrides=["parallel_r1.attention=seen"])
    check = validate_job("pr1_rl", cfg)
    assert not check.native_parallel and check.agent_loop == "single_turn_agent"
    assert check.engine_class.endswith("FSDPEngineWithLMHead") and "VERL_ENGINE_VENDOR" not in check.env_vars
    assert (check.policy_loss, check.adv_estimator, check.remove_padding) == ("vanilla", "grpo", True)
    assert check.env_vars["NPR_SCHEMA"] == "parallel_r1"


def test_a_job_verl_rejects_raises_config_error_naming_our_setting():
    # 16 prompts x 16 samples = 256 rollouts cannot be split over 7 GPUs (verl's own check)
    cfg = load_config(profile="qwen3-4b", overrides=["papo_rl.verl.n_gpus_per_node=7"])
    with pytest.raises(ConfigError, match=r"verl rejects the job.*papo_rl\.verl\.n_gpus_per_node"):
        validate_job("papo_rl", cfg)
    # no log-prob micro-batch without dynamic batch sizes: the failure this project shipped once
    cfg = load_config(profile="qwen3-4b", overrides=["sr_rl.verl.log_prob_micro_batch_size_per_gpu=null"])
    validate_job("sr_rl", cfg)  # falls back to micro_batch_size_per_gpu
    with pytest.raises(ConfigError, match="papo_rl.verl.use_remove_padding"):
        validate_job(
            "papo_rl", load_config(profile="qwen3-4b", overrides=["papo_rl.verl.use_remove_padding=true"])
        )
    with pytest.raises(ConfigError, match="papo_rl.verl.ulysses_sp"):
        validate_job("papo_rl", load_config(profile="qwen3-4b", overrides=["papo_rl.verl.ulysses_sp=2"]))
    # the NPR actor's rules hold for every native parallel stage, Parallel-R1's Unseen one too
    with pytest.raises(ConfigError, match="pr1_rl.verl.use_remove_padding"):
        validate_job(
            "pr1_rl", load_config(profile="qwen3-4b", overrides=["pr1_rl.verl.use_remove_padding=true"])
        )


@pytest.mark.parametrize("profile", [None, "qwen3-4b"], ids=["params.yaml", "qwen3-4b"])
def test_dry_run_shows_a_native_parallel_papo_job(capsys, in_repo, profile):
    """`npr verl launch papo_rl --dry-run` (params.yaml, or a profile)."""
    from components.config import load_config

    assert launch("papo_rl", load_config(profile=profile), dry_run=True) == 0
    out = capsys.readouterr().out
    assert "verl accepts the job" in out
    for line in (
        "#   native_parallel: true",
        '#   agent_loop: "npr_parallel"',
        '#   engine_class: "components.training.verl.plugins.engine.NPRParallelEngine"',
        '#   reward_manager_class: "components.training.verl.plugins.reward.TagKeepingRewardManager"',
        "#   remove_padding: false",
        "#   post_merge_is_threshold: 2.0",
    ):
        assert line in out, line
    argv = shlex.split(out.strip().splitlines()[-1])
    # the profile's papo_rl starts its own Ray head (verl.ray_address: null): the driver as the stage runs it
    assert argv[0] == "env" and "verl.trainer.main_ppo" in argv
    assert "actor_rollout_ref.rollout.agent.default_agent_loop=npr_parallel" in argv
    assert "VERL_ENGINE_VENDOR=npr" in argv


def _problems_dir(tmp_path, n_train: int, n_test: int):
    from components.artifacts import write_shards
    from components.data.synthetic import generate_problems

    rows = generate_problems(n_train + n_test, seed=2)
    out = tmp_path / "problems"
    write_shards(out, [{**r, "split": "test"} for r in rows[:n_test]], 1, stem="test")
    write_shards(out, [{**r, "split": "train"} for r in rows[n_test:]], 1, stem="train")
    return out


def _model_dir(tmp_path: Path) -> Path:
    """A starting model's directory as the launcher reads it (its tokenizer renders the prompts)."""
    from components.models.loading import save_model
    from components.models.tiny import tiny_test_world

    model, tok = tiny_test_world(seed=0)
    return save_model(model, tok, tmp_path / "npr-beta")


def test_papo_stage_on_qwen3_4b_prepares_a_validated_native_parallel_job(tmp_path, in_repo):
    """What `npr stage papo_rl` (backend verl) writes before it runs: the job validate_job accepted,
    with a held-out validation set of the stage's eval_n problems."""
    import pandas as pd

    cfg = load_config(profile="qwen3-4b")
    problems = _problems_dir(tmp_path, n_train=8, n_test=40)
    run_dir = tmp_path / "verl"
    job, path = _prepare("papo_rl", cfg, _model_dir(tmp_path), problems, run_dir)
    saved = yaml.safe_load(path.read_text())
    overrides = set(saved["overrides"])
    assert "actor_rollout_ref.rollout.agent.default_agent_loop=npr_parallel" in overrides
    assert "actor_rollout_ref.model.use_remove_padding=False" in overrides
    assert "+actor_rollout_ref.model.override_config.attn_implementation=sdpa" in overrides
    assert "reward.reward_manager.name=npr" in overrides
    assert saved["runtime_env"]["env_vars"]["VERL_ENGINE_VENDOR"] == "npr"
    assert ray_job_command(job) == shlex.split(saved["command"])
    val = pd.read_parquet(run_dir / "val.parquet")
    assert len(val) == cfg.papo_rl.eval_n == 30 and set(val["extra_info"].map(lambda e: e["split"])) == {
        "test"
    }


def test_the_stage_builds_its_job_once(tmp_path, in_repo, monkeypatch):
    """From `npr stage papo_rl --set papo_rl.backend=verl` to main_ppo's argv and environment: the overrides,
    the input paths, the plugin environment and the reward settings are built once, the starting model's
    tokenizer is loaded once, and the driver gets the built overrides (none read back from a file)."""
    from components.training.verl import job as job_module
    from components.training.verl import launch as launch_module
    from components.training.verl import stage as stage_module
    from components.training.verl import validate as validate_module

    calls: collections.Counter[str] = collections.Counter()

    def count(module, name: str) -> None:
        real = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, **k: calls.update([name]) or real(*a, **k))

    for name in ("build_overrides", "VerlRunInputs", "plugin_env_vars", "reward_settings"):
        count(job_module, name)
    count(stage_module, "verl_job")
    tokenizers = validate_module.AutoTokenizer

    class CountingTokenizer:
        @staticmethod
        def from_pretrained(*args, **kwargs):
            calls.update(["tokenizer"])
            return tokenizers.from_pretrained(*args, **kwargs)

    monkeypatch.setattr(validate_module, "AutoTokenizer", CountingTokenizer)
    cfg = load_config(profile="qwen3-4b", overrides=["papo_rl.backend=verl"])
    problems = _problems_dir(tmp_path, n_train=8, n_test=40)
    # as run_verl_stage does: the stage's job (read once) -> its verl job -> validated, inputs written
    rl = rl_job("papo_rl", cfg)
    job = stage_module.verl_job(rl, model_path=_model_dir(tmp_path), run_dir=tmp_path / "verl")
    stage_module.prepare_job(job, problems)
    argv = launch_module.driver_argv(job, tmp_path / "verl" / "hydra")
    env = launch_module.driver_env(job, 1, tmp_path / "verl" / "attempt-01.jsonl")
    ray_job_command(job)
    assert calls == {
        "verl_job": 1,
        "build_overrides": 1,
        "VerlRunInputs": 1,
        "plugin_env_vars": 1,
        "reward_settings": 1,
        "tokenizer": 1,
    }
    assert argv[3:-1] == job.overrides and env["VERL_ENGINE_VENDOR"] == "npr" and env["NPR_SCHEMA"] == "npr"


def test_the_validation_set_is_the_val_split_when_sample_orz_wrote_one(tmp_path, in_repo):
    """The same split the local trainer's held-out evals read (load_tuning_split): val, not test."""
    import pandas as pd

    from components.artifacts import write_shards
    from components.data.synthetic import generate_problems
    cfg = load_config(profile="qwen3-4b")
    problems = _problems_dir(tmp_path, n_train=8, n_test=40)
    val_rows = [{**r, "split": "val"} for r in generate_problems(40, seed=3)]
    write_shards(problems, val_rows, 1, stem="val")
    _prepare("papo_rl", cfg, _model_dir(tmp_path), problems, tmp_path / "verl")
    val = pd.read_parquet(tmp_path / "verl" / "val.parquet")
    assert len(val) == cfg.papo_rl.eval_n and set(val["extra_info"].map(lambda e: e["split"])) == {"val"}


def test_a_profile_without_held_out_problems_fails_before_any_file_is_written(tmp_path, in_repo):
    cfg = load_config(profile="qwen3-4b")
    problems = _problems_dir(tmp_path, n_train=8, n_test=0)
    with pytest.raises(ConfigError, match="sample_orz.test_n"):
        _prepare("papo_rl", cfg, _model_dir(tmp_path), problems, tmp_path / "verl")
    assert not (tmp_path / "verl" / "train.parquet").exists()


def test_a_prompt_longer_than_max_prompt_length_is_refused_before_launch(tmp_path, in_repo):
    """verl 0.9.1's agent loop would cut it from the front with a log line and go on training
    (data.truncation does not reach it): the launcher refuses the job first, naming the setting and the
    longest prompt."""
    from verl.experimental.agent_loop.agent_loop import AgentLoopBase

    from components.config import ConfigError
    # what verl itself would do with such a prompt: keep its last max_prompt_length tokens
    class _Loop(AgentLoopBase):  # any concrete loop: the cap is the base class's
        async def run(self, sampling_params, **kwargs):
            raise NotImplementedError

    loop = object.__new__(_Loop)
    loop.prompt_length = 4
    loop.rollout_config = OmegaConf.create({"prompt_length": 4})
    assert AgentLoopBase._cap_text_prompt_length(loop, [1, 2, 3, 4, 5, 6]) == [3, 4, 5, 6]

    cfg = load_config(profile="qwen3-4b", overrides=["papo_rl.verl.max_prompt_length=24"])
    problems = _problems_dir(tmp_path, n_train=8, n_test=40)
    with pytest.raises(ConfigError, match=r"papo_rl.verl.max_prompt_length 24: \d+ of \d+ prompts are longer"):
        _prepare("papo_rl", cfg, _model_dir(tmp_path), problems, tmp_path / "verl")
    assert not (tmp_path / "verl" / "train.parquet").exists()


def test_a_parallel_job_from_a_model_without_the_schemas_tags_is_refused_before_launch(tmp_path, in_repo):
    """Found by a real run: every sample of a Parallel-R1 job from a model without Parallel-R1's single-token
    tags failed in its agent loop, after Ray and the trainer had started."""
    from components.models.loading import save_model
    from components.models.tiny import tiny_test_world
    cfg = load_config(profile="qwen3-4b")
    problems = _problems_dir(tmp_path, n_train=8, n_test=40)
    model, tok = tiny_test_world(seed=0, schema_name="npr")  # NPR's tags only
    path = save_model(model, tok, tmp_path / "npr-only")
    with pytest.raises(ConfigError, match="cannot decode the 'parallel_r1' schema natively in parallel"):
        _prepare("pr1_rl", cfg, path, problems, tmp_path / "verl", train_problems=[{"id": "p", "problem": "1+1", "answer": "2"}])


@pytest.mark.parametrize("stage", ["papo_rl", "sr_rl"])
def test_a_served_vllm_rollout_job_is_accepted_with_the_servers_settings(stage: str):
    """``verl.rollout_name: vllm_server``: verl accepts the job; the rollout gets the server spec (absolute: Ray's
    workers run elsewhere), its start timeout and a work folder, and rollout log-probs on every stage (verl's
    rollout-vs-actor check)."""
    cfg = load_config(profile="tiny", overrides=[f"{stage}.verl.rollout_name=vllm_server"])
    check = validate_job(stage, cfg)
    assert check.rollout_class.endswith("VLLMServerReplica + components.training.verl.plugins.torch_rollout.TorchServerAdapter")
    composed = compose_verl_config(build_overrides(stage, getattr(cfg, stage), INPUTS, "npr"))
    rollout = composed.actor_rollout_ref.rollout
    assert rollout.name == "vllm_server" and rollout.calculate_log_probs is True
    assert rollout.custom == {
        "npr_server_spec": str(Path("infra/vllm/server.yaml").resolve()),
        "npr_server_start_timeout_s": 1800.0,
        "npr_server_work_dir": "/runs/x/rollout_server",
    }


def test_a_served_vllm_rollout_is_refused_off_cpu_or_off_temperature_one_or_past_its_context():
    with pytest.raises(ConfigError, match="sr_rl.verl.rollout_name 'vllm_server' with sr_rl.verl.device 'cuda'"):
        validate_job("sr_rl", load_config(profile="qwen3-4b", overrides=["sr_rl.verl.rollout_name=vllm_server"]))
    served = "sr_rl.verl.rollout_name=vllm_server"
    with pytest.raises(ConfigError, match="sr_rl.temperature 0.7 with verl.rollout_name vllm_server"):
        validate_job("sr_rl", load_config(profile="tiny", overrides=[served, "sr_rl.temperature=0.7"]))
    with pytest.raises(ConfigError, match="max_model_len 512 .* below .* = 613"):
        validate_job("sr_rl", load_config(profile="tiny", overrides=[served, "sr_rl.max_new_tokens=484"]))
