"""Launch an RL stage on GPUs with verl 0.9.1: Hydra overrides from the typed config, a Ray job command.

Decisions (issue 6):

- **Entry point: verl's own ``verl.trainer.main_ppo`` for both stages; the verl-recipe DAPO fork is not
  pinned.** verl 0.9.1 carries DAPO's dynamic sampling in its base config (``algorithm.filter_groups``,
  implemented by the v1 trainer's replay buffer), its overlong buffer in the registered ``dapo`` reward
  manager (``reward.reward_kwargs.overlong_buffer_cfg``), and the clip-higher loss as the ``vanilla`` policy
  loss. The recipe repository tracks verl main, not the 0.9.1 release, so pinning it would pin a second,
  moving copy of the trainer.
- **Plugins: our package is imported in every process** through ``VERL_USE_EXTERNAL_MODULES`` (read by
  ``import verl`` itself; set in the Ray job's runtime env) and, redundantly, through
  ``actor_rollout_ref.model.external_lib`` (imported when the workers build their model config). Its import
  registers the ``papo`` loss and advantage, the NPR actor engine, the tag-keeping reward manager and the
  ``npr_parallel`` agent loop (``components.training.verl.plugins``); nothing in verl is edited.
- **Native-parallel PAPO (issue 14):** ``papo_rl`` rolls out with the ``npr_parallel`` agent loop (fork at
  ``</guideline>``, merge at ``<takeaway>``, structural filter, Stage-3 reward set by the loop), trains with
  the NPR actor (``VERL_ENGINE_VENDOR=npr``: canonical parallel mask, positions and prediction sources;
  ``use_remove_padding: false``, ulysses 1, ``sdpa``) and corrects the tokens sampled after a re-prefilled
  merge with a truncated importance weight (``actor.policy_loss.rollout_correction``: ``rollout_is: token``,
  ``rollout_is_threshold`` = ``papo_rl.rollout_correction.is_threshold``).
- **Strict on-policy PAPO:** ``algorithm.rollout_correction.bypass_mode=true`` makes the trainer skip the
  old-log-prob pass (old log-probs are the rollout's); the ``papo`` loss ignores them by construction
  (ratio = π/sg(π)); they only feed the post-merge weights and the mismatch metrics.
- **Reward:** ``reward.custom_reward_function.{path,name}`` naming the module
  ``pkg://components.grading.verl_reward:compute_score``, called by the ``npr`` reward manager (DAPO's, with
  the response decoded with its tags: verl's stock managers skip special tokens, i.e. our tags) for the
  DAPO stages, and by the agent loop for ``papo_rl``.
- **Jobs verl accepts:** ``validate_job(stage, cfg)`` composes the overrides with the installed verl
  config, runs verl's own ``validate_config`` exactly as ``main_ppo`` does, and resolves every plugin the
  job names; ``prepare_launch`` runs it before anything is submitted.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import verl.trainer.config as verl_config
import yaml
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf
from transformers import AutoTokenizer
from verl.trainer.ppo.core_algos import get_adv_estimator_fn, get_policy_loss_fn
from verl.trainer.ppo.reward import get_custom_reward_fn, resolve_reward_manager_cls
from verl.utils.config import omega_conf_to_dataclass
from verl.utils.config import validate_config as verl_validate_config
from verl.utils.device import auto_set_device
from verl.utils.import_utils import load_extern_object
from verl.workers.engine.base import EngineRegistry
from verl.workers.rollout import base as rollout_base
from verl.workers.rollout.replica import RolloutReplicaRegistry

from components.artifacts import read_shards
from components.data.problems import load_tuning_split
from components.grading.config import REWARD_SECTIONS
from components.ops.launch import RAY_JOB_SPEC, load_spec
from components.prompts import PromptConfig, chat_messages, render_prompt
from components.settings import ConfigError
from components.structure import TagIds
from components.structure.errors import TagTokenError
from components.training.config import RLStageConfig, rl_section
from components.training.job import VerlJobConfig
from components.training.rl_objective import verl_names
from components.training.verl.plugins.agent_loop import registered_agent_loop
from components.training.verl.plugins.engine import NPRParallelEngine
from components.training.verl.plugins.names import (
    AGENT_LOOP,
    CPU_PLATFORM,
    CPU_ROLLOUTS,
    ENGINE_VENDOR,
    ENGINE_VENDOR_ENV,
    MERGE_ENV,
    PLATFORM_ENV,
    PLUGIN_PACKAGE,
    REPLAY_MODULE,
    REPLAY_SAMPLER,
    REWARD_MANAGER,
    SCHEMA_ENV,
    SERVED_ROLLOUT,
    SERVED_SPEC_KEY,
    SERVED_START_TIMEOUT_KEY,
    SERVED_WORK_DIR_KEY,
)
from components.training.verl.plugins.reward import TagKeepingRewardManager
from components.training.verl.ray_cluster import submit_stage_job

PLUGIN_MODULE = PLUGIN_PACKAGE
# verl loads the reward function by module (pkg://), not by a file path: a relative path resolves against each
# worker's working directory, which is not the checkout when a stage runs elsewhere (a test repository, a
# copied work tree), and every worker has the package importable
REWARD_FILE = "pkg://components.grading.verl_reward"
REWARD_FUNCTION = "compute_score"
VERL_ENTRY_MODULE = "verl.trainer.main_ppo"
# attention implementations that honour the NPR actor's 4D mask (eager gets its additive form)
PARALLEL_ATTENTION = ("sdpa", "flex_attention", "eager")
# attention implementations verl's Ulysses sequence parallelism works with (it patches flash-attention only)
ULYSSES_ATTENTION = ("flash_attention_2",)
REPO_ROOT = Path(__file__).resolve().parents[3]


@dataclass(frozen=True)
class VerlRunInputs:
    """Paths a verl run reads and writes (parquet files produced by the data layer, an HF model dir)."""

    model_path: str
    train_files: str
    val_files: str
    run_dir: str


def _fmt(value: Any) -> str:
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, float):
        return repr(value)
    return str(value)


def native_parallel(stage_cfg: RLStageConfig) -> bool:
    """Whether a stage rolls out with the native fork/merge agent loop and trains with the NPR actor (the
    canonical parallel mask): every stage whose ``engine_mode`` is parallel (PAPO; Parallel-R1 Unseen)."""
    return stage_cfg.engine_mode == "parallel"


def remove_padding(stage_cfg: RLStageConfig) -> bool:
    """verl's packed forward: as configured, else on for the stock actor and off for the NPR actor."""
    if stage_cfg.verl.use_remove_padding is not None:
        return bool(stage_cfg.verl.use_remove_padding)
    return not native_parallel(stage_cfg)


def build_overrides(
    stage: str,
    stage_cfg: RLStageConfig,
    inputs: VerlRunInputs,
    project: str,
    *,
    attn_implementation: str = "sdpa",
    enable_thinking: bool = False,
) -> list[str]:
    """Hydra overrides of ``verl/trainer/config/ppo_trainer.yaml`` for one RL stage.

    Keys that the packaged config does not define carry Hydra's ``+`` prefix (the DAPO reward manager's
    kwargs, the model's attention implementation, the actor's rollout correction); every other key must
    exist in the installed verl (tests compose them and run verl's validation to prove it).
    """
    v = stage_cfg.verl
    adv_estimator, loss_mode = verl_names(stage_cfg.algorithm)
    is_papo = stage_cfg.algorithm == "papo"
    native = native_parallel(stage_cfg)
    # dynamic sampling is DAPO's (PAPO and Parallel-R1's GRPO train on every group)
    filter_groups = stage_cfg.dynamic_sampling and stage_cfg.algorithm == "dapo"
    gen_prompts = stage_cfg.gen_batch_prompts or stage_cfg.prompts_per_step
    log_prob_micro = v.log_prob_micro_batch_size_per_gpu or v.micro_batch_size_per_gpu
    pairs: list[tuple[str, Any]] = [
        # data
        ("data.train_files", inputs.train_files),
        ("data.val_files", inputs.val_files),
        ("data.prompt_key", "prompt"),
        ("data.max_prompt_length", v.max_prompt_length),
        # verl counts the stop token as a response token; the agent loop gives the fork/merge controller the
        # local trainer's budget (max_new_tokens) and appends the stop token after it
        ("data.max_response_length", stage_cfg.max_new_tokens + (1 if native else 0)),
        ("data.train_batch_size", stage_cfg.prompts_per_step),
        ("data.gen_batch_size", gen_prompts),
        ("data.truncation", "error"),
        # the chat-template settings of components.prompts.render_prompt (the local trainer's prompts)
        ("+data.apply_chat_template_kwargs.enable_thinking", enable_thinking),
        # algorithm
        ("algorithm.adv_estimator", adv_estimator),
        ("algorithm.use_kl_in_reward", False),
        ("algorithm.norm_adv_by_std_in_grpo", stage_cfg.norm_adv_by_std),
        ("algorithm.filter_groups.enable", filter_groups),
        ("algorithm.filter_groups.metric", "reward"),
        ("algorithm.filter_groups.max_num_gen_batches", stage_cfg.max_gen_batches),
        ("algorithm.rollout_correction.bypass_mode", is_papo),
        # model
        ("actor_rollout_ref.model.path", inputs.model_path),
        ("actor_rollout_ref.model.enable_gradient_checkpointing", v.gradient_checkpointing),
        ("actor_rollout_ref.model.use_remove_padding", remove_padding(stage_cfg)),
        ("+actor_rollout_ref.model.override_config.attn_implementation", attn_implementation),
        ("actor_rollout_ref.model.external_lib", PLUGIN_PACKAGE),
        # actor
        ("actor_rollout_ref.actor.strategy", v.strategy),
        ("actor_rollout_ref.actor.policy_loss.loss_mode", loss_mode),
        ("actor_rollout_ref.actor.clip_ratio_low", stage_cfg.clip_ratio_low),
        ("actor_rollout_ref.actor.clip_ratio_high", stage_cfg.clip_ratio_high),
        ("actor_rollout_ref.actor.clip_ratio_c", stage_cfg.clip_ratio_c),
        ("actor_rollout_ref.actor.loss_agg_mode", stage_cfg.loss_agg_mode),
        ("actor_rollout_ref.actor.use_kl_loss", False),
        ("actor_rollout_ref.actor.entropy_coeff", 0),
        ("actor_rollout_ref.actor.grad_clip", stage_cfg.grad_clip),
        ("actor_rollout_ref.actor.ppo_epochs", 1),
        # prompts per optimizer step: the stage's mini_batches split of its prompts, as the local trainer's
        ("actor_rollout_ref.actor.ppo_mini_batch_size", stage_cfg.prompts_per_step // stage_cfg.mini_batches),
        ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", v.micro_batch_size_per_gpu),
        ("actor_rollout_ref.actor.use_dynamic_bsz", v.use_dynamic_bsz),
        ("actor_rollout_ref.actor.ppo_max_token_len_per_gpu", v.max_token_len_per_gpu),
        ("actor_rollout_ref.actor.ulysses_sequence_parallel_size", v.ulysses_sp),
        ("actor_rollout_ref.actor.fsdp_config.param_offload", v.param_offload),
        ("actor_rollout_ref.actor.fsdp_config.optimizer_offload", v.optimizer_offload),
        ("+actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype", v.param_dtype),
        ("+actor_rollout_ref.actor.fsdp_config.mixed_precision.reduce_dtype", "fp32"),
        ("+actor_rollout_ref.actor.fsdp_config.mixed_precision.buffer_dtype", "fp32"),
        ("actor_rollout_ref.actor.optim.lr", stage_cfg.lr),
        ("actor_rollout_ref.actor.optim.lr_warmup_steps", stage_cfg.lr_warmup_steps),
        ("actor_rollout_ref.actor.optim.lr_scheduler_type", stage_cfg.lr_scheduler),
        ("actor_rollout_ref.actor.optim.min_lr_ratio", stage_cfg.min_lr_ratio),
        ("actor_rollout_ref.actor.optim.weight_decay", stage_cfg.weight_decay),
        ("actor_rollout_ref.actor.optim.betas", list(stage_cfg.adam_betas)),
        # rollout
        ("actor_rollout_ref.rollout.name", v.rollout_name),
        ("actor_rollout_ref.rollout.n", stage_cfg.group_size),
        ("actor_rollout_ref.rollout.temperature", stage_cfg.temperature),
        ("actor_rollout_ref.rollout.top_p", stage_cfg.top_p),
        ("actor_rollout_ref.rollout.top_k", -1),
        # the stage's seed for rollouts (the agent loop's and the torch server's sampling seeds) and data order
        ("actor_rollout_ref.rollout.seed", stage_cfg.seed),
        ("data.seed", stage_cfg.seed),
        ("actor_rollout_ref.rollout.tensor_model_parallel_size", v.rollout_tp),
        ("actor_rollout_ref.rollout.gpu_memory_utilization", v.gpu_memory_utilization),
        # verl's validation samples the held-out problems as the local trainer's evaluation does
        ("actor_rollout_ref.rollout.val_kwargs.n", stage_cfg.eval_samples),
        ("actor_rollout_ref.rollout.val_kwargs.temperature", stage_cfg.eval_temperature),
        ("actor_rollout_ref.rollout.val_kwargs.top_p", stage_cfg.eval_top_p),
        ("actor_rollout_ref.rollout.val_kwargs.do_sample", True),
        ("actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu", log_prob_micro),
        ("actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu", log_prob_micro),
        # reward: DAPO's manager (overlong buffer) decoding with the tags kept
        ("reward.reward_manager.name", REWARD_MANAGER),
        ("reward.custom_reward_function.path", REWARD_FILE),
        ("reward.custom_reward_function.name", REWARD_FUNCTION),
        ("+reward.reward_kwargs.max_resp_len", stage_cfg.max_new_tokens),
        ("+reward.reward_kwargs.overlong_buffer_cfg.enable", stage_cfg.overlong_buffer_len > 0),
        ("+reward.reward_kwargs.overlong_buffer_cfg.len", stage_cfg.overlong_buffer_len),
        ("+reward.reward_kwargs.overlong_buffer_cfg.penalty_factor", stage_cfg.overlong_penalty_factor),
        ("+reward.reward_kwargs.overlong_buffer_cfg.log", True),
        # trainer
        ("trainer.project_name", project),
        ("trainer.experiment_name", stage),
        # file: verl's per-step metrics as JSON lines, which the stage reports from (verl.report)
        ("trainer.logger", ["console", "wandb", "file"]),
        ("trainer.nnodes", v.nnodes),
        ("trainer.n_gpus_per_node", v.n_gpus_per_node),
        ("trainer.total_epochs", v.total_epochs),
        ("trainer.total_training_steps", stage_cfg.steps),
        ("trainer.test_freq", stage_cfg.eval_every),
        ("trainer.save_freq", stage_cfg.save_every),
        ("trainer.val_before_train", stage_cfg.eval_before_train),
        ("trainer.resume_mode", "auto"),
        ("trainer.default_local_dir", str(Path(inputs.run_dir) / "checkpoints")),
        ("trainer.max_actor_ckpt_to_keep", v.keep_checkpoints),
        ("actor_rollout_ref.rollout.agent.num_workers", v.agent_loop_workers),
        ("reward.num_workers", v.reward_workers),
        ("data.dataloader_num_workers", v.dataloader_workers),
        ("trainer.device", v.device),
        ("transfer_queue.backend.SimpleStorage.num_data_storage_units", v.storage_units),
    ]
    # every stage samples its steps through the bounded replay buffer (plugins.replay): DAPO's refills stop
    # after max_gen_batches generation batches, as the local trainer's (verl's v1 buffer ignores the cap)
    pairs += [
        ("trainer.v1.sampler.custom_sampler.path", f"pkg://{REPLAY_MODULE}"),
        ("trainer.v1.sampler.custom_sampler.name", REPLAY_SAMPLER),
        ("+trainer.v1.sampler.sampler_kwargs.train_batch_size", stage_cfg.prompts_per_step),
        ("+trainer.v1.sampler.sampler_kwargs.dapo_metric", "reward" if filter_groups else "null"),
        (
            "+trainer.v1.sampler.sampler_kwargs.max_dapo_evictions",
            (stage_cfg.max_gen_batches - 1) * stage_cfg.prompts_per_step
            if stage_cfg.max_gen_batches > 0
            else "null",
        ),
    ]
    if v.rollout_name == SERVED_ROLLOUT:
        pairs += [
            # the stock server the rollout launches (plugins.vllm_rollout); paths absolute: Ray's workers
            # do not run in the stage's directory
            ("+actor_rollout_ref.rollout.custom", _served_rollout_custom(v, inputs.run_dir)),
        ]
    if native or v.rollout_name == SERVED_ROLLOUT:
        # rollout log-probs: bypass mode's old log-probs and the post-merge correction (PAPO); for a served
        # rollout also verl's rollout-vs-actor check (training/rollout_probs_diff_*) on every stage, which
        # shows the served policy is the trained one after every weight update
        pairs += [("actor_rollout_ref.rollout.calculate_log_probs", True)]
    if native:
        pairs += [
            # native fork/merge rollouts
            ("actor_rollout_ref.rollout.agent.default_agent_loop", AGENT_LOOP),
        ]
        if stage_cfg.structural_filter:
            # a group whose every rollout the filter dropped is refilled, within a bound (plugins.replay)
            pairs += [
                ("trainer.v1.sampler.sync_refill_failed_groups", True),
                (
                    "+trainer.v1.sampler.sampler_kwargs.max_emptied_groups",
                    v.max_refill_batches * stage_cfg.prompts_per_step,
                ),
            ]
        if stage_cfg.rollout_correction.post_merge_is:
            pairs += [
                ("+actor_rollout_ref.actor.policy_loss.rollout_correction.rollout_is", "token"),
                (
                    "+actor_rollout_ref.actor.policy_loss.rollout_correction.rollout_is_threshold",
                    float(stage_cfg.rollout_correction.is_threshold),
                ),
            ]
    return [f"{key}={_hydra_value(value)}" for key, value in pairs]


def _hydra_value(value: Any) -> str:
    if isinstance(value, list):
        return "[" + ",".join(_hydra_value(v) for v in value) + "]"
    if isinstance(value, dict):  # strings quoted: paths may hold characters Hydra's grammar reserves
        items = (f"{k}:{_quoted(v) if isinstance(v, str) else _hydra_value(v)}" for k, v in value.items())
        return "{" + ",".join(items) + "}"
    return _fmt(value)


def _quoted(text: str) -> str:
    if "'" in text:
        raise ConfigError(f"a path with a single quote cannot be passed to verl's Hydra config: {text!r}")
    return f"'{text}'"


def _served_rollout_custom(v: Any, run_dir: str) -> dict[str, Any]:
    """``rollout.custom`` of a ``vllm_server`` job: the server spec, its start timeout and the rollout's work
    folder (untied copy, each update's weights, server logs, stats)."""
    return {
        SERVED_SPEC_KEY: str(Path(v.rollout_server.spec).resolve()),
        SERVED_START_TIMEOUT_KEY: float(v.rollout_server.start_timeout_s),
        SERVED_WORK_DIR_KEY: str(Path(run_dir) / "rollout_server"),
    }


def plugin_env_vars(stage_cfg: RLStageConfig, schema: str = "npr", merge: str = "isolated") -> dict[str, str]:
    """What selects our plugins in every process of the job: the package verl imports, the structure
    schema they parse, and (native parallel stages) the engine vendor key of the NPR actor and the merge
    semantics its forward lays out (``merge_semantics``)."""
    env = {"VERL_USE_EXTERNAL_MODULES": PLUGIN_PACKAGE, SCHEMA_ENV: schema}
    if native_parallel(stage_cfg):
        env[ENGINE_VENDOR_ENV] = ENGINE_VENDOR
        env[MERGE_ENV] = merge
    if stage_cfg.verl.device == "cpu":
        env[PLATFORM_ENV] = CPU_PLATFORM
    return env


def runtime_env(stage_cfg: RLStageConfig, schema: str = "npr", merge: str = "isolated") -> dict[str, Any]:
    """Ray job runtime env: the repository as working dir, our plugins imported by every ``import verl``."""
    # no auth setting here: the job inherits the cluster's token authentication (infra/ray/cluster.yaml)
    env_vars = {"TOKENIZERS_PARALLELISM": "true"}
    env_vars.update(plugin_env_vars(stage_cfg, schema, merge))
    return {
        "working_dir": ".",
        "env_vars": env_vars,
        "excludes": ["artifacts/", ".venv/", ".git/", "dvc-remote/"],
    }


def ray_job_command(
    stage_cfg: RLStageConfig, overrides: list[str], job_id: str, schema: str = "npr", merge: str = "isolated"
) -> list[str]:
    """``ray job submit`` argv running ``python -m verl.trainer.main_ppo <overrides>`` on the cluster; with
    ``verl.ray_address: null`` the driver as the stage runs it against the Ray head it starts itself
    (``components.training.verl.ray_cluster``), shown with that head's placeholder address."""
    if not stage_cfg.verl.ray_address:
        env = [f"{k}={v}" for k, v in sorted(plugin_env_vars(stage_cfg, schema, merge).items())]
        return [
            "env",
            "RAY_ADDRESS=<the head npr stage starts>",
            *env,
            "python",
            "-m",
            VERL_ENTRY_MODULE,
            *overrides,
        ]
    return [
        "ray",
        "job",
        "submit",
        f"--address={stage_cfg.verl.ray_address}",
        f"--submission-id={job_id}",
        f"--runtime-env-json={json.dumps(runtime_env(stage_cfg, schema, merge), sort_keys=True)}",
        "--",
        "python",
        "-m",
        VERL_ENTRY_MODULE,
        *overrides,
    ]


def write_launch_files(
    run_dir: Path,
    stage: str,
    stage_cfg: RLStageConfig,
    overrides: list[str],
    job_id: str,
    schema: str = "npr",
    merge: str = "isolated",
) -> Path:
    """Write ``verl_overrides.yaml`` (the resolved overrides + the command) into the run directory."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    command = ray_job_command(stage_cfg, overrides, job_id, schema, merge)
    path = run_dir / "verl_overrides.yaml"
    payload = {
        "stage": stage,
        "entry": VERL_ENTRY_MODULE,
        "overrides": overrides,
        "runtime_env": runtime_env(stage_cfg, schema, merge),
        "command": shlex.join(command),
    }
    tmp = path.with_suffix(".yaml.tmp")
    tmp.write_text(yaml.safe_dump(payload, sort_keys=False, width=120))
    tmp.replace(path)
    return path


def verl_config_dir() -> Path:
    """The Hydra config directory packaged with the installed verl."""
    return Path(verl_config.__file__).parent


def compose_verl_config(overrides: list[str]) -> Any:
    """Compose ``ppo_trainer`` with ``overrides`` against the installed verl's packaged config.

    Raises Hydra's error (naming the key) when an override does not exist in this verl version.
    """
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(verl_config_dir()), version_base=None):
        return compose(config_name="ppo_trainer", overrides=overrides)


def reward_settings(stage_cfg: RLStageConfig, cfg: VerlJobConfig, schema: str | None = None) -> dict[str, Any]:
    """What ``verl_reward.compute_score`` reads from each row's ``extra_info``: the stage's reward
    (``grading.REWARD_SECTIONS``), its values and the grading settings from params.yaml, and the schema."""
    grading = cfg.grading.model_dump(mode="json")
    return {
        "reward": stage_cfg.reward,
        "reward_values": grading.pop(stage_cfg.reward),
        "grading": {k: v for k, v in grading.items() if k not in REWARD_SECTIONS},
        "schema": schema or cfg.schema_name,
    }


def write_verl_parquet(
    problems: list[dict[str, Any]],
    path: Path,
    prompts_cfg: PromptConfig,
    style: str,
    reward: dict[str, Any] | None = None,
    generation: dict[str, Any] | None = None,
    *,
    held_out: bool = False,
) -> int:
    """Problems as verl's RL dataset: chat ``prompt``, ``data_source``, ``reward_model.ground_truth``.

    The user turn is built by ``components.prompts.chat_messages`` (the same text the local trainer uses);
    ``reward`` (see ``reward_settings``) rides in every row's ``extra_info`` so verl scores with our config,
    and so do the recipe's extra engine settings (``generation``: Parallel-R1's paths per block), which the
    agent loop gives its fork/merge controller.
    """
    extra = dict(reward or {})
    if generation:
        extra["generation"] = dict(generation)

    rows = [
        {
            "data_source": p.get("source", "orz"),
            "prompt": chat_messages(p["problem"], prompts_cfg, style),
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(p["answer"])},
            # index: verl's per-prompt index (rollout traces, the agent loop's seed without a uid)
            # held_out: verl's validation set (verl does not tell the agent loop which batch it validates)
            "extra_info": {
                "id": p["id"],
                "index": i,
                "split": p.get("split", "train"),
                "held_out": held_out,
                **extra,
            },
        }
        for i, p in enumerate(problems)
    ]
    if not rows:
        raise ValueError(f"no problems to write to {path}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_parquet(path, index=False)
    return len(rows)


def job_inputs(stage: str, cfg: VerlJobConfig, model_path: Path | str | None = None) -> tuple[VerlRunInputs, Path]:
    """The paths a stage's verl job reads and writes (run dir ``artifacts/<stage>/work/verl``)."""
    run_dir = Path(cfg.run.artifacts_dir) / stage / "work" / "verl"
    model = (
        model_path
        if model_path is not None
        else Path(cfg.run.artifacts_dir) / rl_section(cfg, stage).init_from / "model"
    )
    inputs = VerlRunInputs(
        model_path=str(Path(model).resolve()),
        train_files=str((run_dir / "train.parquet").resolve()),
        val_files=str((run_dir / "val.parquet").resolve()),
        run_dir=str(run_dir.resolve()),
    )
    return inputs, run_dir


def stage_overrides(stage: str, cfg: VerlJobConfig, inputs: VerlRunInputs) -> list[str]:
    """``build_overrides`` with the pipeline-wide settings a job also needs (attention, W&B project)."""
    return build_overrides(
        stage,
        rl_section(cfg, stage),
        inputs,
        cfg.tracking.project,
        attn_implementation=cfg.models.attn_implementation,
        enable_thinking=cfg.prompts.enable_thinking,
    )


def check_prompt_lengths(
    stage: str,
    stage_cfg: RLStageConfig,
    prompts_cfg: PromptConfig,
    model_path: Path | str,
    problems: list[dict[str, Any]],
) -> int:
    """The longest prompt of the job in tokens, as verl's agent loop renders it (our chat messages through
    the model's chat template); ConfigError when one exceeds ``<stage>.verl.max_prompt_length``.

    verl 0.9.1's agent loop cuts a longer prompt from the front and goes on, with a log line only
    (``data.truncation: error`` does not reach it, ``AgentLoopBase._cap_text_prompt_length``): the model
    would be trained on problems with their beginning missing. So the job is refused before it is launched."""
    tokenizer = AutoTokenizer.from_pretrained(str(model_path))
    texts = [render_prompt(tokenizer, p["problem"], prompts_cfg, stage_cfg.prompt_style) for p in problems]
    lengths = [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]] if texts else [0]
    longest = max(range(len(lengths)), key=lengths.__getitem__)
    bound = stage_cfg.verl.max_prompt_length
    if lengths[longest] > bound:
        over = sum(n > bound for n in lengths)
        raise ConfigError(
            f"{stage}.verl.max_prompt_length {bound}: {over} of {len(lengths)} prompts are longer (the longest, "
            f"problem {problems[longest].get('id')!r}, has {lengths[longest]} tokens); verl's agent loop would "
            "cut them from the front. Raise max_prompt_length or filter the problems"
        )
    return lengths[longest]


def check_tag_tokens(stage: str, model_path: Path | str, schema: str) -> None:
    """ConfigError unless the starting model's tokenizer holds ``schema``'s tags as single tokens: the
    ``npr_parallel`` agent loop and the NPR actor need them, and without them every sample of the job fails
    in its agent loop (found by a real run: a Parallel-R1 job from a model without Parallel-R1's tags)."""
    tokenizer = AutoTokenizer.from_pretrained(str(model_path))
    try:
        TagIds.from_tokenizer(tokenizer, schema)
    except TagTokenError as err:
        raise ConfigError(
            f"{stage}: the starting model {model_path} cannot decode the {schema!r} schema natively in "
            f"parallel: {err}"
        ) from err


def prepare_launch(
    stage: str,
    cfg: VerlJobConfig,
    model_path: Path,
    problems_dir: Path,
    run_dir: Path,
    write: bool = True,
    *,
    train_problems: list[dict[str, Any]] | None = None,
) -> tuple[list[str], Path]:
    """Validate the job (``validate_job``), write the parquet inputs and ``verl_overrides.yaml``;
    returns (argv, overrides file). The validation split is the first ``eval_n`` held-out problems, the
    ones the local trainer evaluates on; the training split is ``problems_dir``'s, or ``train_problems``
    (a stage with its own data layer: pr1_rl)."""
    validate_job(stage, cfg)
    stage_cfg = rl_section(cfg, stage)
    style = stage_cfg.prompt_style
    run_dir = Path(run_dir)
    train = train_problems if train_problems is not None else read_shards(problems_dir, stem="train")

    # the split the local trainer's held-out evals read too: val when sample_orz wrote one, else test
    test = load_tuning_split(problems_dir)[1][: stage_cfg.eval_n]
    if not test:
        raise ConfigError(
            f"{stage}: {problems_dir} has no held-out problems for verl's validation set; "
            "set sample_orz.val_n or sample_orz.test_n > 0"
        )
    check_prompt_lengths(stage, stage_cfg, cfg.prompts, model_path, [*train, *test])
    schema = cfg.schema_of(stage)
    if native_parallel(stage_cfg):
        check_tag_tokens(stage, model_path, schema)
    reward = reward_settings(stage_cfg, cfg, schema)
    engine = cfg.engine_settings_of(stage)
    if write:
        write_verl_parquet(train, run_dir / "train.parquet", cfg.prompts, style, reward, engine)
        write_verl_parquet(test, run_dir / "val.parquet", cfg.prompts, style, reward, engine, held_out=True)
    inputs = VerlRunInputs(
        model_path=str(Path(model_path).resolve()),
        train_files=str((run_dir / "train.parquet").resolve()),
        val_files=str((run_dir / "val.parquet").resolve()),
        run_dir=str(run_dir.resolve()),
    )
    overrides = stage_overrides(stage, cfg, inputs)
    job_id = f"npr-{stage}-{cfg.profile}"
    merge = cfg.merge_semantics
    path = write_launch_files(run_dir, stage, stage_cfg, overrides, job_id, schema, merge)
    return ray_job_command(stage_cfg, overrides, job_id, schema, merge), path


# ------------------------------------------------------------------------------------------- validation
@dataclass(frozen=True)
class VerlJobCheck:
    """What ``validate_job`` resolved for one stage's job (everything verl will look up by name)."""

    stage: str
    overrides: list[str]
    env_vars: dict[str, str]
    engine_class: str
    agent_loop: str
    agent_loop_class: str
    reward_manager_class: str
    reward_function: str
    policy_loss: str
    adv_estimator: str
    remove_padding: bool
    attn_implementation: str
    ulysses_sp: int
    bypass_mode: bool
    post_merge_is_threshold: float | None
    trainer_class: str = ""
    rollout_class: str = ""
    sampler_class: str | None = None

    @property
    def native_parallel(self) -> bool:
        """Rollouts fork and merge natively and the actor scores them with the canonical parallel mask."""
        return self.agent_loop == AGENT_LOOP and self.env_vars.get(ENGINE_VENDOR_ENV) == ENGINE_VENDOR

    def summary(self) -> dict[str, Any]:
        """The settings that make the job what it is (printed by ``--dry-run`` and ``npr config check``)."""
        out = asdict(self)
        out.pop("overrides")
        out["native_parallel"] = self.native_parallel
        return out


# verl's error messages name verl keys; these are the settings of ours that produce them (build_overrides)
_VERL_SOURCES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("real_train_batch_size", ("prompts_per_step", "group_size", "verl.n_gpus_per_node", "verl.nnodes")),
    ("train_batch_size", ("prompts_per_step",)),
    ("ppo_mini_batch_size", ("mini_batches", "prompts_per_step", "group_size")),
    ("ppo_micro_batch_size", ("verl.micro_batch_size_per_gpu",)),
    ("log_prob_micro_batch_size", ("verl.log_prob_micro_batch_size_per_gpu", "verl.use_dynamic_bsz")),
    ("ulysses_sequence_parallel_size", ("verl.ulysses_sp",)),
    ("n_gpus", ("verl.n_gpus_per_node", "verl.nnodes")),
    ("max_token_len", ("verl.max_token_len_per_gpu",)),
    ("loss_agg_mode", ("loss_agg_mode",)),
    ("temperature", ("temperature", "eval_temperature")),
)


def _settings_named_in(stage: str, message: str) -> list[str]:
    found: list[str] = []
    for needle, settings in _VERL_SOURCES:
        if needle in message:
            found += [f"{stage}.{s}" for s in settings if f"{stage}.{s}" not in found]
    return found


def _verl_rejects(stage: str, err: BaseException) -> Exception:
    named = _settings_named_in(stage, str(err))
    hint = f" (settings: {', '.join(named)})" if named else ""
    return ConfigError(f"{stage}: verl rejects the job: {err}{hint}")


@contextlib.contextmanager
def _environment(values: dict[str, str], unset: tuple[str, ...] = ()) -> Iterator[None]:
    """``os.environ`` with ``values`` set and ``unset`` removed, restored afterwards."""
    saved = {k: os.environ.get(k) for k in (*values, *unset)}
    os.environ.update(values)
    for key in unset:
        os.environ.pop(key, None)
    try:
        yield
    finally:
        for key, old in saved.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old


def _check_stage_settings(stage: str, stage_cfg: RLStageConfig, cfg: VerlJobConfig) -> None:
    """Our own cross-field rules of a verl job, checked before verl sees it (errors name our settings)."""
    v = stage_cfg.verl
    if stage_cfg.algorithm == "papo" and not native_parallel(stage_cfg):
        raise ConfigError(
            f"{stage}: PAPO on verl rolls out natively in parallel with the structural filter; set "
            f"{stage}.engine_mode: parallel and {stage}.structural_filter: true"
        )
    if v.ulysses_sp > 1 and cfg.models.attn_implementation not in ULYSSES_ATTENTION:
        # verl's monkey patch (verl/models/transformers/monkey_patch.py) replaces only transformers'
        # flash-attention forward with the all-to-all one; sdpa never calls it, so each rank would attend
        # within its own slice of the sequence and train on wrong log-probs
        raise ConfigError(
            f"{stage}.verl.ulysses_sp {v.ulysses_sp} needs models.attn_implementation in {ULYSSES_ATTENTION} "
            f"(verl patches only flash-attention for sequence parallelism; "
            f"{cfg.models.attn_implementation!r} would attend within each rank's slice): set "
            f"{stage}.verl.ulysses_sp: 1"
        )
    if stage_cfg.prompts_per_step % stage_cfg.mini_batches:
        raise ConfigError(
            f"{stage}.prompts_per_step {stage_cfg.prompts_per_step} must split into {stage}.mini_batches "
            f"{stage_cfg.mini_batches} equal mini-batches (verl's ppo_mini_batch_size is in prompts)"
        )
    if (v.device == "cpu") != (v.rollout_name in CPU_ROLLOUTS):
        raise ConfigError(
            f"{stage}.verl.rollout_name {v.rollout_name!r} with {stage}.verl.device {v.device!r}: the torch "
            "rollout is the CPU platform's (SGLang and vLLM need CUDA); set rollout_name: torch with "
            "device: cpu, sglang or vllm with device: cuda"
        )
    if v.rollout_name == SERVED_ROLLOUT:
        _check_served_rollout(stage, stage_cfg)
    if not native_parallel(stage_cfg):
        return
    if v.use_remove_padding:
        raise ConfigError(
            f"{stage}.verl.use_remove_padding must be false (or unset): the NPR actor builds a 4D parallel "
            "attention mask, which verl's packed forward drops"
        )
    if v.ulysses_sp != 1:
        raise ConfigError(
            f"{stage}.verl.ulysses_sp must be 1: Ulysses sequence parallelism needs the packed forward, "
            "which cannot carry the parallel mask"
        )
    if cfg.models.attn_implementation not in PARALLEL_ATTENTION:
        raise ConfigError(
            f"models.attn_implementation must be one of {PARALLEL_ATTENTION} for {stage}: flash-attention "
            "takes no 4D mask"
        )
    if not stage_cfg.structural_filter:
        raise ConfigError(
            f"{stage}: native parallel rollouts need the structural filter (a broken trace has no parallel "
            f"mask); set {stage}.structural_filter: true"
        )
    if stage_cfg.algorithm == "papo" and stage_cfg.reward != "stage3":
        raise ConfigError(
            f"{stage}.reward must be stage3 for PAPO (the agent loop scores its rollouts with it)"
        )


def validate_job(stage: str, cfg: VerlJobConfig) -> VerlJobCheck:
    """Check that verl accepts ``stage``'s job, without a GPU; ConfigError (naming the setting) if not.

    Builds the launcher's overrides, composes them with the installed verl's ``ppo_trainer`` config, runs
    ``verl.utils.config.validate_config`` exactly as ``verl.trainer.main_ppo`` calls it (after
    ``auto_set_device``), converts the algorithm and rollout sections to verl's dataclasses, and resolves
    every name the job relies on, in the environment the job runs with: the policy loss and advantage
    estimator in verl's registries, the actor engine class by vendor key (``EngineRegistry``, device cuda),
    the agent loop class, the reward manager class and the reward function file (loaded and called once).
    """
    stage_cfg = rl_section(cfg, stage)
    _check_stage_settings(stage, stage_cfg, cfg)
    inputs, _ = job_inputs(stage, cfg)
    overrides = stage_overrides(stage, cfg, inputs)
    schema = cfg.schema_of(stage)
    env_vars = plugin_env_vars(stage_cfg, schema, cfg.merge_semantics)

    from verl.trainer.ppo.utils import need_critic, need_reference_policy  # lazy: verl

    config = compose_verl_config(overrides)
    auto_set_device(config)
    try:
        verl_validate_config(
            config=config,
            use_reference_policy=need_reference_policy(config),
            use_critic=need_critic(config),
        )
        omega_conf_to_dataclass(config.algorithm)
        omega_conf_to_dataclass(config.actor_rollout_ref.rollout)
    except (AssertionError, ValueError, TypeError) as err:
        raise _verl_rejects(stage, err) from err

    actor = config.actor_rollout_ref.actor
    loss_mode, adv_estimator = actor.policy_loss.loss_mode, config.algorithm.adv_estimator
    try:
        get_policy_loss_fn(loss_mode)
        get_adv_estimator_fn(adv_estimator)
    except (KeyError, ValueError) as err:
        raise ConfigError(
            f"{stage}.algorithm: verl has no loss/advantage {loss_mode!r}/{adv_estimator!r}: {err}"
        ) from err

    # the job's environment: the vendor key only where the launcher sets it, the device a GPU node has
    unset = () if ENGINE_VENDOR_ENV in env_vars else (ENGINE_VENDOR_ENV,)
    with _environment({**env_vars, "VERL_ENGINE_DEVICE": stage_cfg.verl.device}, unset):
        engine_cls = EngineRegistry.get_engine_cls("language_model", actor.strategy)
    parallel_actor = issubclass(engine_cls, NPRParallelEngine)
    native = native_parallel(stage_cfg)
    if native != parallel_actor:
        raise ConfigError(
            f"{stage}: the actor engine {engine_cls.__name__} does not match engine_mode {stage_cfg.engine_mode}"
        )

    agent_name = config.actor_rollout_ref.rollout.agent.default_agent_loop
    try:
        agent_cls = registered_agent_loop(agent_name)
    except (KeyError, ImportError) as err:
        raise ConfigError(f"{stage}: verl has no agent loop {agent_name!r}: {err}") from err
    if native != (agent_name == AGENT_LOOP):
        raise ConfigError(
            f"{stage}: agent loop {agent_name!r} does not match engine_mode {stage_cfg.engine_mode}"
        )

    manager_cls = resolve_reward_manager_cls(config)
    if not issubclass(manager_cls, TagKeepingRewardManager):
        raise ConfigError(
            f"{stage}: reward manager {manager_cls.__name__} decodes without our tags (special tokens); "
            f"use {REWARD_MANAGER!r}"
        )
    reward_cfg = OmegaConf.create(OmegaConf.to_container(config, resolve=False))
    reward_fn = get_custom_reward_fn(reward_cfg)
    if reward_fn is None:
        raise ConfigError(f"{stage}: the job names no reward function")
    # global_step: what the agent loop and the reward manager add for scheduled rewards
    probe = reward_fn(
        data_source="probe",
        solution_str="\\boxed{1}",
        ground_truth="1",
        extra_info={**reward_settings(stage_cfg, cfg, schema), "global_step": 1},
    )
    if not isinstance(probe, dict) or "score" not in probe:
        raise ConfigError(f"{stage}: the reward function returned {probe!r}, not verl's score dict")

    trainer_class = _resolve_trainer(stage, config)
    rollout_class = _resolve_rollout(stage, config)
    sampler_class = _resolve_sampler(stage, config)

    correction = actor.policy_loss.get("rollout_correction") or {}
    threshold = correction.get("rollout_is_threshold") if correction.get("rollout_is") == "token" else None
    bypass = bool(config.algorithm.rollout_correction.bypass_mode)
    if stage_cfg.algorithm == "papo" and not bypass:
        raise ConfigError(
            f"{stage}: PAPO is strictly on-policy and needs algorithm.rollout_correction.bypass_mode"
        )
    return VerlJobCheck(
        stage=stage,
        overrides=overrides,
        env_vars=env_vars,
        engine_class=f"{engine_cls.__module__}.{engine_cls.__qualname__}",
        agent_loop=agent_name,
        agent_loop_class=f"{agent_cls.__module__}.{agent_cls.__qualname__}",
        reward_manager_class=f"{manager_cls.__module__}.{manager_cls.__qualname__}",
        reward_function=f"{config.reward.custom_reward_function.path}:{config.reward.custom_reward_function.name}",
        policy_loss=loss_mode,
        adv_estimator=adv_estimator,
        remove_padding=bool(config.actor_rollout_ref.model.use_remove_padding),
        attn_implementation=str(config.actor_rollout_ref.model.override_config.attn_implementation),
        ulysses_sp=int(actor.ulysses_sequence_parallel_size),
        bypass_mode=bypass,
        post_merge_is_threshold=None if threshold is None else float(threshold),
        trainer_class=trainer_class,
        rollout_class=rollout_class,
        sampler_class=sampler_class,
    )


def _qualname(obj: Any) -> str:
    return f"{obj.__module__}.{obj.__qualname__}"


def _resolve_trainer(stage: str, config: Any) -> str:
    """The trainer class ``main_ppo`` will run, with every import it needs at run time: verl 0.9.1's v1
    trainer (``trainer.use_v1``, its default) imports TransferQueue in the TaskRunner, after Ray started,
    so a missing package surfaced only minutes into a GPU job."""
    if not config.trainer.use_v1:
        from verl.trainer.main_ppo_v0 import TaskRunner  # lazy: verl

        return _qualname(TaskRunner)
    try:
        import transfer_queue  # noqa: F401  # lazy: check (TaskRunnerV1.run imports it; a missing one is a ConfigError here)
        from verl.trainer.ppo.v1 import get_trainer_cls  # lazy: verl
    except ImportError as err:
        raise ConfigError(
            f"{stage}: verl's v1 trainer (trainer.use_v1, verl 0.9.1's default) cannot import: {err}; it needs "
            "TransferQueue (pyproject.toml and infra/gpu/requirements.txt pin TransferQueue==0.1.11)"
        ) from err
    try:
        return _qualname(get_trainer_cls(config.trainer.v1.trainer_mode))
    except (KeyError, ValueError, AssertionError) as err:
        raise ConfigError(
            f"{stage}: verl has no v1 trainer {config.trainer.v1.trainer_mode!r}: {err}"
        ) from err


def _check_served_rollout(stage: str, stage_cfg: RLStageConfig) -> None:
    """A ``vllm_server`` rollout: the server spec exists and its context fits a prompt and its response, and
    the rollout samples at temperature 1 (vLLM returns the model's raw log-probs; verl's actor divides by the
    rollout temperature, so at any other one the two would differ by construction)."""
    v = stage_cfg.verl
    spec = Path(v.rollout_server.spec)
    if not spec.is_file():
        raise ConfigError(f"{stage}.verl.rollout_server.spec: {spec} does not exist")
    context = load_spec(spec).get("max_model_len")
    need = v.max_prompt_length + stage_cfg.max_new_tokens + 1
    if context is not None and need > int(context):
        raise ConfigError(
            f"{stage}.verl.rollout_server.spec: max_model_len {context} in {spec} is below "
            f"verl.max_prompt_length + max_new_tokens + 1 = {need}"
        )
    if stage_cfg.temperature != 1.0:
        raise ConfigError(
            f"{stage}.temperature {stage_cfg.temperature} with verl.rollout_name {SERVED_ROLLOUT}: vLLM returns "
            "log-probs before temperature, which verl's actor compares at the rollout temperature; use 1.0"
        )


def _resolve_rollout(stage: str, config: Any) -> str:
    """The rollout replica registered under ``rollout.name``; for the project's CPU rollouts also their classes
    (verl's SGLang or vLLM replica imports its server, which needs CUDA, so only its name is checked here)."""
    name = config.actor_rollout_ref.rollout.name
    if name not in RolloutReplicaRegistry._registry:
        raise ConfigError(
            f"{stage}.verl.rollout_name: verl has no rollout {name!r}; registered: "
            f"{sorted(RolloutReplicaRegistry._registry)}"
        )
    if (name, config.actor_rollout_ref.rollout.mode) not in rollout_base._ROLLOUT_REGISTRY:
        raise ConfigError(
            f"{stage}.verl.rollout_name: verl has no {config.actor_rollout_ref.rollout.mode} adapter for {name!r}"
        )
    if name not in CPU_ROLLOUTS:
        return name
    replica = RolloutReplicaRegistry.get(name)
    adapter = rollout_base.get_rollout_class(name, config.actor_rollout_ref.rollout.mode)
    return f"{_qualname(replica)} + {_qualname(adapter)}"


def _resolve_sampler(stage: str, config: Any) -> str | None:
    """The custom replay buffer the job names (structural-filter stages), loaded as verl loads it."""
    custom = config.trainer.v1.sampler.get("custom_sampler") or {}
    if not custom.get("path"):
        return None
    try:
        return _qualname(load_extern_object(custom.path, custom.name))
    except (ImportError, AttributeError, FileNotFoundError) as err:
        raise ConfigError(
            f"{stage}: the job's replay buffer {custom.path}:{custom.name} does not load: {err}"
        ) from err


def launch(stage: str, cfg: VerlJobConfig, dry_run: bool = False) -> int | None:
    """``npr verl launch STAGE [--dry-run] [--profile P]``: validate the verl job of an RL stage, print its
    settings and command, and (without ``dry_run``) write its inputs and submit it to the running cluster at
    ``verl.ray_address``; returns the exit status. None when there is no such cluster: the job then needs
    the head the stage starts itself, so the caller runs the stage (``components.stages.run_stage``, in its
    own process), which builds the job once, runs verl's ``main_ppo`` and merges."""
    stage_cfg = rl_section(cfg, stage)
    try:
        check = validate_job(stage, cfg)
    except ConfigError as err:
        print(f"error: {err}")
        return 2
    print(f"# {stage} ({cfg.profile}): verl accepts the job")
    for key, value in check.summary().items():
        print(f"#   {key}: {json.dumps(value, sort_keys=True)}")
    if dry_run:
        inputs, _ = job_inputs(stage, cfg)
        overrides = stage_overrides(stage, cfg, inputs)
        print(
            shlex.join(
                ray_job_command(
                    stage_cfg,
                    overrides,
                    f"npr-{stage}-{cfg.profile}",
                    cfg.schema_of(stage),
                    cfg.merge_semantics,
                )
            )
        )
        return 0
    if not stage_cfg.verl.ray_address:
        print(f"# {stage}: no verl.ray_address, so the stage starts its own Ray head and runs the job")
        return None
    # The cluster reproduces the whole stage, exactly as the pipeline's npr-stage flow submits it
    # (infra/ray/job.yaml): inputs pulled from the DVC remote there, files under verl.shared_dir, outputs and
    # run-cache pushed back. Overrides built here would name this machine's paths, which no node has.
    run_id = f"manual-{time.strftime('%Y%m%d-%H%M%S')}"
    work = Path(cfg.run.artifacts_dir) / stage / "work"
    work.mkdir(parents=True, exist_ok=True)
    print(f"# submitting {stage} to {stage_cfg.verl.ray_address} as npr-{stage}-{run_id} (infra/ray/job.yaml)")
    done = submit_stage_job(stage, load_spec(RAY_JOB_SPEC), run_id, stage_cfg.verl.ray_address, work)
    if done.returncode == 0:
        print(f"# {stage} ran on the cluster; its outputs are on the DVC remote: `dvc pull {stage}` brings them here")
    return done.returncode
