"""verl's validation of a built job (``validate_job``) and of its inputs (``check_inputs``), before anything runs.

``validate_job(job)`` composes the job's overrides with the installed verl's ``ppo_trainer`` config, runs
verl's own ``validate_config`` exactly as ``main_ppo`` does, and resolves every plugin the job names;
``check_inputs(job, problems)`` measures the job's prompts with its model's tokenizer. Both take the
``VerlJob`` that ``job.verl_job`` built and build nothing again. The one module of the package, besides the
plugins, that imports verl's trainer code.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import verl.trainer.config as verl_config
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

from components.ops.launch import load_spec
from components.prompts import render_prompt
from components.settings import ConfigError
from components.structure import TagIds
from components.structure.errors import TagTokenError
from components.training.config import RLStageConfig
from components.training.verl.job import VerlJob, native_parallel
from components.training.verl.plugin_names import (
    AGENT_LOOP,
    CPU_ROLLOUTS,
    ENGINE_VENDOR,
    ENGINE_VENDOR_ENV,
    REWARD_MANAGER,
    SERVED_ROLLOUT,
)
from components.training.verl.plugins.agent_loop import registered_agent_loop
from components.training.verl.plugins.engine import NPRParallelEngine
from components.training.verl.plugins.reward import TagKeepingRewardManager

# attention implementations that honour the NPR actor's 4D mask (eager gets its additive form)
PARALLEL_ATTENTION = ("sdpa", "flex_attention", "eager")

# attention implementations verl's Ulysses sequence parallelism works with (it patches flash-attention only)
ULYSSES_ATTENTION = ("flash_attention_2",)


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


def check_settings(job: VerlJob) -> None:
    """Our own cross-field rules of a verl job, checked before verl sees it (errors name our settings)."""
    stage, stage_cfg, attn = job.stage, job.section, job.attn_implementation
    v = stage_cfg.verl
    if stage_cfg.algorithm == "papo" and not native_parallel(stage_cfg):
        raise ConfigError(
            f"{stage}: PAPO on verl rolls out natively in parallel with the structural filter; set "
            f"{stage}.engine_mode: parallel and {stage}.structural_filter: true"
        )
    if v.ulysses_sp > 1 and attn not in ULYSSES_ATTENTION:
        # verl's monkey patch (verl/models/transformers/monkey_patch.py) replaces only transformers'
        # flash-attention forward with the all-to-all one; sdpa never calls it, so each rank would attend
        # within its own slice of the sequence and train on wrong log-probs
        raise ConfigError(
            f"{stage}.verl.ulysses_sp {v.ulysses_sp} needs models.attn_implementation in {ULYSSES_ATTENTION} "
            f"(verl patches only flash-attention for sequence parallelism; "
            f"{attn!r} would attend within each rank's slice): set "
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
    if attn not in PARALLEL_ATTENTION:
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


def validate_job(job: VerlJob) -> VerlJobCheck:
    """Check that verl accepts ``stage``'s job, without a GPU; ConfigError (naming the setting) if not.

    Composes the job's overrides (``job.verl_job``) with the installed verl's ``ppo_trainer`` config, runs
    ``verl.utils.config.validate_config`` exactly as ``verl.trainer.main_ppo`` calls it (after
    ``auto_set_device``), converts the algorithm and rollout sections to verl's dataclasses, and resolves
    every name the job relies on, in the environment the job runs with: the policy loss and advantage
    estimator in verl's registries, the actor engine class by vendor key (``EngineRegistry``, device cuda),
    the agent loop class, the reward manager class and the reward function file (loaded and called once).
    """
    stage, stage_cfg, overrides, env_vars = job.stage, job.section, job.overrides, job.env_vars
    check_settings(job)

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
    native = job.native_parallel
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
        extra_info={**job.reward, "global_step": 1},
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


def check_prompt_lengths(job: VerlJob, tokenizer: Any, problems: list[dict[str, Any]]) -> int:
    """The longest prompt of the job in tokens, as verl's agent loop renders it (our chat messages through
    the model's chat template); ConfigError when one exceeds ``<stage>.verl.max_prompt_length``.

    verl 0.9.1's agent loop cuts a longer prompt from the front and goes on, with a log line only
    (``data.truncation: error`` does not reach it, ``AgentLoopBase._cap_text_prompt_length``): the model
    would be trained on problems with their beginning missing. So the job is refused before it is launched."""
    stage, stage_cfg, prompts_cfg = job.stage, job.section, job.prompts
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


def check_tag_tokens(job: VerlJob, tokenizer: Any) -> None:
    """ConfigError unless the starting model's tokenizer holds ``schema``'s tags as single tokens: the
    ``npr_parallel`` agent loop and the NPR actor need them, and without them every sample of the job fails
    in its agent loop (found by a real run: a Parallel-R1 job from a model without Parallel-R1's tags)."""
    stage, model_path, schema = job.stage, job.inputs.model_path, job.schema
    try:
        TagIds.from_tokenizer(tokenizer, schema)
    except TagTokenError as err:
        raise ConfigError(
            f"{stage}: the starting model {model_path} cannot decode the {schema!r} schema natively in "
            f"parallel: {err}"
        ) from err


def check_inputs(job: VerlJob, problems: list[dict[str, Any]]) -> int:
    """The job's problems against its starting model's tokenizer (loaded once): every prompt within
    ``verl.max_prompt_length`` (``check_prompt_lengths``) and, for a native parallel job, the schema's tags
    single tokens (``check_tag_tokens``); returns the longest prompt's length."""
    tokenizer = AutoTokenizer.from_pretrained(job.inputs.model_path)
    longest = check_prompt_lengths(job, tokenizer, problems)
    if job.native_parallel:
        check_tag_tokens(job, tokenizer)
    return longest
