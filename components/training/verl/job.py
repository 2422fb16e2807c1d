"""The verl job of an RL stage, built once: Hydra overrides from the typed config, its input paths, the plugin
environment, the settings every row of its data carries.

``verl_job(job)`` builds one ``VerlJob`` from an RL stage's job (``components.training.job.RLJob``: its
section and the shared settings, read once); ``build_job(stage, cfg)`` does the same straight from the config for
what has no stage job in hand (``npr verl launch``, ``npr config check``). What comes after reads that object
and builds none of it again: verl's validation (``validate``), the parquet inputs and the job's record
(``write_job_files``), the driver's command and environment (``launch``). Nothing here calls or imports
verl: the overrides are strings, composed and checked by ``validate``, and the names the plugins register
come from ``plugin_names``, outside the ``plugins`` package whose import registers them
(tests/unit/training/test_verl_imports.py).

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
- **Jobs verl accepts:** ``validate.validate_job(job)`` composes the job's overrides with the installed verl
  config, runs verl's own ``validate_config`` exactly as ``main_ppo`` does, and resolves every plugin the
  job names; the stage (``stage.prepare_job``) and ``npr verl launch`` run it before anything is written or
  submitted.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from components.artifacts import read_shards
from components.data.problems import load_tuning_split
from components.grading.config import REWARD_SECTIONS, GradingConfig
from components.prompts import PromptConfig, chat_messages
from components.settings import ConfigError
from components.training.config import RLStageConfig
from components.training.job import RLJob, RLJobConfig, rl_job
from components.training.verl.plugin_names import (
    AGENT_LOOP,
    CPU_PLATFORM,
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
    verl_names,
)

PLUGIN_MODULE = PLUGIN_PACKAGE
# verl loads the reward function by module (pkg://), not by a file path: a relative path resolves against each
# worker's working directory, which is not the checkout when a stage runs elsewhere (a test repository, a
# copied work tree), and every worker has the package importable
REWARD_FILE = "pkg://components.grading.verl_reward"
REWARD_FUNCTION = "compute_score"
VERL_ENTRY_MODULE = "verl.trainer.main_ppo"


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


def reward_settings(stage_cfg: RLStageConfig, grading: GradingConfig, schema: str) -> dict[str, Any]:
    """What ``verl_reward.compute_score`` reads from each row's ``extra_info``: the stage's reward
    (``grading.REWARD_SECTIONS``), its values and the grading settings from params.yaml, and the schema."""
    values = grading.model_dump(mode="json")
    return {
        "reward": stage_cfg.reward,
        "reward_values": values.pop(stage_cfg.reward),
        "grading": {k: v for k, v in values.items() if k not in REWARD_SECTIONS},
        "schema": schema,
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


@dataclass(frozen=True)
class VerlJob:
    """One RL stage's verl job, built once (``verl_job``): what it trains (the stage's ``section``), where it
    reads and writes (``inputs``), the Hydra overrides of verl's ``ppo_trainer`` config, the environment that
    selects our plugins in every process (``env_vars``), and what every row of its data carries (``reward``,
    the recipe's extra engine settings ``engine``). Validation, the job's files and the driver read it."""

    stage: str
    section: RLStageConfig
    profile: str
    schema: str
    merge_semantics: str
    attn_implementation: str
    prompts: PromptConfig
    inputs: VerlRunInputs
    overrides: list[str]
    env_vars: dict[str, str]
    reward: dict[str, Any]
    engine: dict[str, Any]

    @property
    def job_id(self) -> str:
        """The Ray submission id of the job."""
        return f"npr-{self.stage}-{self.profile}"

    @property
    def run_dir(self) -> Path:
        return Path(self.inputs.run_dir)

    @property
    def native_parallel(self) -> bool:
        return native_parallel(self.section)


def verl_job(
    job: RLJob, *, model_path: Path | str | None = None, run_dir: Path | str | None = None
) -> VerlJob:
    """The verl job of an RL stage's job (``components.training.job.RLJob``): the one place its overrides,
    input paths, plugin environment and row settings are built. ``model_path``: the starting model (default
    ``<artifacts>/<init_from>/model``); ``run_dir``: the job's inputs, checkpoints and logs (default
    ``<artifacts>/<stage>/work/verl``; a job inside a Ray cluster uses the shared filesystem)."""
    section, stage = job.section, job.stage
    artifacts = Path(job.run.artifacts_dir)
    run = Path(run_dir) if run_dir is not None else artifacts / stage / "work" / "verl"
    model = Path(model_path) if model_path is not None else artifacts / section.init_from / "model"
    inputs = VerlRunInputs(
        model_path=str(model.resolve()),
        train_files=str((run / "train.parquet").resolve()),
        val_files=str((run / "val.parquet").resolve()),
        run_dir=str(run.resolve()),
    )
    overrides = build_overrides(
        stage,
        section,
        inputs,
        job.tracking.project,
        attn_implementation=job.models.attn_implementation,
        enable_thinking=job.prompts.enable_thinking,
    )
    return VerlJob(
        stage=stage,
        section=section,
        profile=job.profile,
        schema=job.schema,
        merge_semantics=job.merge_semantics,
        attn_implementation=job.models.attn_implementation,
        prompts=job.prompts,
        inputs=inputs,
        overrides=overrides,
        env_vars=plugin_env_vars(section, job.schema, job.merge_semantics),
        reward=reward_settings(section, job.grading, job.schema),
        engine=dict(job.generation),
    )


def build_job(
    stage: str,
    cfg: RLJobConfig,
    *,
    model_path: Path | str | None = None,
    run_dir: Path | str | None = None,
) -> VerlJob:
    """``stage``'s verl job straight from the pipeline's config, for what has no stage job in hand (``npr verl
    launch``, ``npr config check``): the stage's ``RLJob`` (``rl_job``), then ``verl_job``."""
    return verl_job(rl_job(stage, cfg), model_path=model_path, run_dir=run_dir)


def runtime_env(job: VerlJob) -> dict[str, Any]:
    """Ray job runtime env: the repository as working dir, our plugins imported by every ``import verl``."""
    # no auth setting here: the job inherits the cluster's token authentication (infra/ray/cluster.yaml)
    return {
        "working_dir": ".",
        "env_vars": {"TOKENIZERS_PARALLELISM": "true", **job.env_vars},
        "excludes": ["artifacts/", ".venv/", ".git/", "dvc-remote/"],
    }


def ray_job_command(job: VerlJob) -> list[str]:
    """``ray job submit`` argv running ``python -m verl.trainer.main_ppo <overrides>`` on the cluster; with
    ``verl.ray_address: null`` the driver as the stage runs it against the Ray head it starts itself
    (``components.training.verl.ray_cluster``), shown with that head's placeholder address."""
    address = job.section.verl.ray_address
    if not address:
        env = [f"{k}={v}" for k, v in sorted(job.env_vars.items())]
        return [
            "env",
            "RAY_ADDRESS=<the head npr stage starts>",
            *env,
            "python",
            "-m",
            VERL_ENTRY_MODULE,
            *job.overrides,
        ]
    return [
        "ray",
        "job",
        "submit",
        f"--address={address}",
        f"--submission-id={job.job_id}",
        f"--runtime-env-json={json.dumps(runtime_env(job), sort_keys=True)}",
        "--",
        "python",
        "-m",
        VERL_ENTRY_MODULE,
        *job.overrides,
    ]


def read_problems(
    job: VerlJob, problems_dir: Path, train_problems: list[dict[str, Any]] | None = None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(training problems, validation problems) of the job: ``problems_dir``'s train split, or
    ``train_problems`` (a stage with its own data layer: pr1_rl); the validation set is the first ``eval_n``
    held-out problems, the ones the local trainer evaluates on (val when sample_orz wrote one, else test)."""
    train = train_problems if train_problems is not None else read_shards(problems_dir, stem="train")
    val = load_tuning_split(problems_dir)[1][: job.section.eval_n]
    if not val:
        raise ConfigError(
            f"{job.stage}: {problems_dir} has no held-out problems for verl's validation set; "
            "set sample_orz.val_n or sample_orz.test_n > 0"
        )
    return train, val


def write_job_files(job: VerlJob, train: list[dict[str, Any]], val: list[dict[str, Any]]) -> Path:
    """Write the job's parquet inputs and ``verl_overrides.yaml`` into its run dir; returns the latter.

    ``verl_overrides.yaml`` (the overrides, runtime env and command) is a record for whoever reads the run
    folder: the driver gets ``job.overrides`` itself, nothing reads the file back."""
    style = job.section.prompt_style
    write_verl_parquet(train, Path(job.inputs.train_files), job.prompts, style, job.reward, job.engine)
    write_verl_parquet(
        val, Path(job.inputs.val_files), job.prompts, style, job.reward, job.engine, held_out=True
    )
    job.run_dir.mkdir(parents=True, exist_ok=True)
    path = job.run_dir / "verl_overrides.yaml"
    payload = {
        "stage": job.stage,
        "entry": VERL_ENTRY_MODULE,
        "overrides": job.overrides,
        "runtime_env": runtime_env(job),
        "command": shlex.join(ray_job_command(job)),
    }
    tmp = path.with_suffix(".yaml.tmp")
    tmp.write_text(yaml.safe_dump(payload, sort_keys=False, width=120))
    tmp.replace(path)
    return path
