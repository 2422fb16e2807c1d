"""Launch an RL stage on GPUs with verl 0.9.1: Hydra overrides from the typed config, a Ray job command.

Decisions (issue 6):

- **Entry point: verl's own ``verl.trainer.main_ppo`` for both stages; the verl-recipe DAPO fork is not
  pinned.** verl 0.9.1 carries DAPO's dynamic sampling in its base config (``algorithm.filter_groups``,
  implemented by the v1 trainer's replay buffer), its overlong buffer in the registered ``dapo`` reward
  manager (``reward.reward_kwargs.overlong_buffer_cfg``), and the clip-higher loss as the ``vanilla`` policy
  loss. The recipe repository tracks verl main, not the 0.9.1 release, so pinning it would pin a second,
  moving copy of the trainer.
- **Plugins: our module is imported in every process** through ``VERL_USE_EXTERNAL_MODULES`` (read by
  ``import verl`` itself; set in the Ray job's runtime env) and, redundantly, through
  ``actor_rollout_ref.model.external_lib`` (imported when the workers build their model config). Either
  alone registers ``papo`` before the actor looks up its loss or the driver its advantage estimator.
- **Strict on-policy PAPO:** ``algorithm.rollout_correction.bypass_mode=true`` makes the trainer skip the
  old-log-prob pass; the ``papo`` loss ignores ``old_log_prob`` by construction (ratio = π/sg(π)).
- **Reward:** ``reward.custom_reward_function.{path,name}`` (0.9.1's place for the legacy top-level
  ``custom_reward_function`` keys, which it migrates there) pointing at
  ``components/grading/verl_reward.py:compute_score``.

Not covered by stock verl (and therefore not generated here): NPR's native-parallel rollout (fork at
``</guideline>``, merge at ``<takeaway>``) and the per-sample 4D-mask actor forward. A PAPO run through this
launcher rolls out with verl's sequential engine; the local trainer (``components.training.rl``) is the
implementation with parallel rollouts and structural filtering.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from components.training.rl_objective import verl_names

PLUGIN_MODULE = "components.training.papo"
REWARD_FILE = "components/grading/verl_reward.py"
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


def build_overrides(stage: str, stage_cfg: Any, inputs: VerlRunInputs, project: str) -> list[str]:
    """Hydra overrides of ``verl/trainer/config/ppo_trainer.yaml`` for one RL stage.

    Keys that the packaged config does not define carry Hydra's ``+`` prefix (the DAPO reward manager's
    kwargs); every other key must exist in the installed verl (tests compose them to prove it).
    """
    v = stage_cfg.verl
    adv_estimator, loss_mode = verl_names(stage_cfg.algorithm)
    is_papo = stage_cfg.algorithm == "papo"
    filter_groups = stage_cfg.dynamic_sampling and not is_papo
    gen_prompts = stage_cfg.gen_batch_prompts or stage_cfg.prompts_per_step
    pairs: list[tuple[str, Any]] = [
        # data
        ("data.train_files", inputs.train_files),
        ("data.val_files", inputs.val_files),
        ("data.prompt_key", "prompt"),
        ("data.max_prompt_length", v.max_prompt_length),
        ("data.max_response_length", stage_cfg.max_new_tokens),
        ("data.train_batch_size", stage_cfg.prompts_per_step),
        ("data.gen_batch_size", gen_prompts),
        ("data.truncation", "error"),
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
        ("actor_rollout_ref.model.use_remove_padding", v.use_remove_padding),
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
        ("actor_rollout_ref.actor.ppo_mini_batch_size", v.train_prompt_mini_batch),
        ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", v.micro_batch_size_per_gpu),
        ("actor_rollout_ref.actor.use_dynamic_bsz", v.use_dynamic_bsz),
        ("actor_rollout_ref.actor.ppo_max_token_len_per_gpu", v.max_token_len_per_gpu),
        ("actor_rollout_ref.actor.ulysses_sequence_parallel_size", v.ulysses_sp),
        ("actor_rollout_ref.actor.fsdp_config.param_offload", v.param_offload),
        ("actor_rollout_ref.actor.fsdp_config.optimizer_offload", v.optimizer_offload),
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
        ("actor_rollout_ref.rollout.tensor_model_parallel_size", v.rollout_tp),
        ("actor_rollout_ref.rollout.gpu_memory_utilization", v.gpu_memory_utilization),
        ("actor_rollout_ref.rollout.val_kwargs.n", v.val_n),
        ("actor_rollout_ref.rollout.val_kwargs.temperature", stage_cfg.eval_temperature),
        ("actor_rollout_ref.rollout.val_kwargs.top_p", v.val_top_p),
        ("actor_rollout_ref.rollout.val_kwargs.do_sample", True),
        # reward
        ("reward.reward_manager.name", "dapo"),
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
        ("trainer.logger", ["console", "wandb"]),
        ("trainer.nnodes", v.nnodes),
        ("trainer.n_gpus_per_node", v.n_gpus_per_node),
        ("trainer.total_epochs", v.total_epochs),
        ("trainer.total_training_steps", stage_cfg.steps),
        ("trainer.test_freq", stage_cfg.eval_every),
        ("trainer.save_freq", stage_cfg.save_every),
        ("trainer.val_before_train", stage_cfg.eval_before_train),
        ("trainer.resume_mode", "auto"),
        ("trainer.default_local_dir", str(Path(inputs.run_dir) / "checkpoints")),
    ]
    if is_papo:
        pairs.append(("actor_rollout_ref.model.external_lib", PLUGIN_MODULE))
    return [f"{key}={_hydra_value(value)}" for key, value in pairs]


def _hydra_value(value: Any) -> str:
    if isinstance(value, list):
        return "[" + ",".join(_hydra_value(v) for v in value) + "]"
    return _fmt(value)


def runtime_env(stage_cfg: Any) -> dict[str, Any]:
    """Ray job runtime env: the repository as working dir, our plugins imported by every ``import verl``."""
    # no auth setting here: the job inherits the cluster's token authentication (infra/ray/cluster.yaml)
    env_vars = {"TOKENIZERS_PARALLELISM": "true"}
    if stage_cfg.algorithm == "papo":
        env_vars["VERL_USE_EXTERNAL_MODULES"] = PLUGIN_MODULE
    return {
        "working_dir": ".",
        "env_vars": env_vars,
        "excludes": ["artifacts/", ".venv/", ".git/", "dvc-remote/"],
    }


def ray_job_command(stage_cfg: Any, overrides: list[str], job_id: str) -> list[str]:
    """``ray job submit`` argv running ``python -m verl.trainer.main_ppo <overrides>`` on the cluster."""
    return [
        "ray",
        "job",
        "submit",
        f"--address={stage_cfg.verl.ray_address}",
        f"--submission-id={job_id}",
        f"--runtime-env-json={json.dumps(runtime_env(stage_cfg), sort_keys=True)}",
        "--",
        "python",
        "-m",
        VERL_ENTRY_MODULE,
        *overrides,
    ]


def write_launch_files(run_dir: Path, stage: str, stage_cfg: Any, overrides: list[str], job_id: str) -> Path:
    """Write ``verl_overrides.yaml`` (the resolved overrides + the command) into the run directory."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    command = ray_job_command(stage_cfg, overrides, job_id)
    path = run_dir / "verl_overrides.yaml"
    payload = {
        "stage": stage,
        "entry": VERL_ENTRY_MODULE,
        "overrides": overrides,
        "runtime_env": runtime_env(stage_cfg),
        "command": shlex.join(command),
    }
    tmp = path.with_suffix(".yaml.tmp")
    tmp.write_text(yaml.safe_dump(payload, sort_keys=False, width=120))
    tmp.replace(path)
    return path


def verl_config_dir() -> Path:
    """The Hydra config directory packaged with the installed verl."""
    import verl.trainer.config as verl_config

    return Path(verl_config.__file__).parent


def compose_verl_config(overrides: list[str]) -> Any:
    """Compose ``ppo_trainer`` with ``overrides`` against the installed verl's packaged config.

    Raises Hydra's error (naming the key) when an override does not exist in this verl version.
    """
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(verl_config_dir()), version_base=None):
        return compose(config_name="ppo_trainer", overrides=overrides)


def reward_settings(stage_cfg: Any, cfg: Any) -> dict[str, Any]:
    """What ``verl_reward.compute_score`` reads from each row's ``extra_info``: the stage's reward
    (stage1 / stage3), its values and the grading settings from params.yaml, and the schema."""
    grading = cfg.grading.model_dump(mode="json")
    return {
        "reward": stage_cfg.reward,
        "reward_values": grading.pop(stage_cfg.reward),
        "grading": {k: v for k, v in grading.items() if k not in ("stage1", "stage3")},
        "schema": cfg.schema_name,
    }


def write_verl_parquet(
    problems: list[dict[str, Any]],
    path: Path,
    prompts_cfg: Any,
    style: str,
    reward: dict[str, Any] | None = None,
) -> int:
    """Problems as verl's RL dataset: chat ``prompt``, ``data_source``, ``reward_model.ground_truth``.

    The user turn is built by ``components.prompts.chat_messages`` (the same text the local trainer uses);
    ``reward`` (see ``reward_settings``) rides in every row's ``extra_info`` so verl scores with our config.
    """
    import pandas as pd

    from components.prompts import chat_messages

    rows = [
        {
            "data_source": p.get("source", "orz"),
            "prompt": chat_messages(p["problem"], prompts_cfg, style),
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(p["answer"])},
            "extra_info": {"id": p["id"], "split": p.get("split", "train"), **(reward or {})},
        }
        for p in problems
    ]
    if not rows:
        raise ValueError(f"no problems to write to {path}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_parquet(path, index=False)
    return len(rows)


def prepare_launch(
    stage: str, cfg: Any, model_path: Path, problems_dir: Path, run_dir: Path, write: bool = True
) -> tuple[list[str], Path]:
    """Write the parquet inputs and ``verl_overrides.yaml`` for ``stage``; returns (argv, overrides file).

    ``write=False`` (a dry run) writes nothing and returns the command and the file it would write.
    """
    from components.artifacts import read_shards

    stage_cfg = getattr(cfg, stage)
    style = stage_cfg.prompt_style
    run_dir = Path(run_dir)
    train = read_shards(problems_dir, stem="train")
    test = read_shards(problems_dir, stem="test")
    reward = reward_settings(stage_cfg, cfg)
    if write:
        write_verl_parquet(train, run_dir / "train.parquet", cfg.prompts, style, reward)
        write_verl_parquet(test, run_dir / "val.parquet", cfg.prompts, style, reward)
    inputs = VerlRunInputs(
        model_path=str(Path(model_path).resolve()),
        train_files=str((run_dir / "train.parquet").resolve()),
        val_files=str((run_dir / "val.parquet").resolve()),
        run_dir=str(run_dir.resolve()),
    )
    overrides = build_overrides(stage, stage_cfg, inputs, cfg.tracking.project)
    job_id = f"npr-{stage}-{cfg.profile}"
    if write:
        path = write_launch_files(run_dir, stage, stage_cfg, overrides, job_id)
    else:
        path = run_dir / "verl_overrides.yaml"
    return ray_job_command(stage_cfg, overrides, job_id), path


def main(argv: list[str] | None = None) -> int:
    """``python -m components.training.verl_launch STAGE [--dry-run]``: submit the Ray job (``--dry-run``:
    print it, write nothing)."""
    import argparse
    import subprocess

    from components.config import load_config
    from components.dag import stage_io

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("stage", choices=["npr_zero", "papo_rl", "sr_rl"])
    parser.add_argument("--dry-run", action="store_true", help="print the command; write nothing")
    args = parser.parse_args(argv)
    cfg = load_config()
    stage_cfg = getattr(cfg, args.stage)
    io = stage_io(args.stage)
    run_dir = Path(cfg.run.artifacts_dir) / args.stage / "work" / "verl"
    command, path = prepare_launch(
        args.stage,
        cfg,
        io.input(f"{stage_cfg.init_from}/model"),
        io.input("sample_orz/problems"),
        run_dir,
        write=not args.dry_run,
    )
    print(
        f"# dry run: nothing written (the overrides would go to {path})"
        if args.dry_run
        else f"# overrides written to {path}"
    )
    print(shlex.join(command))
    if args.dry_run:
        return 0
    return subprocess.call(command)


if __name__ == "__main__":
    raise SystemExit(main())
