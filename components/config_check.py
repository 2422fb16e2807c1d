"""`npr config check`: every static check of a profile, before any stage runs.

Each check is a plain function of the validated config returning ``Check`` rows (one per stage where it
applies); ``check_profile`` runs them all. What is checked:

- **validation split**: the RL stages evaluate on the problems' test split (verl: ``data.val_files``),
  so ``sample_orz.test_n`` must be > 0 when an RL stage runs;
- **memory plan**: each stage's plan per GPU (``components.training.memory``) against ``orchestration.gpu``
  (or ``--gpu KIND`` of ``infra/gpus.yaml``) with ``memory.MIN_HEADROOM`` of it left free;
- **context length**: prompt bound + ``max_new_tokens`` within the model's positions, and within an SGLang
  server's ``context_length`` where a stage samples from one;
- **GPU count**: what each stage's job asks the gpu pool for (``memory.gpus_for``, derived from the stage's
  own settings) fits a node, a stage that needs GPUs is placed on the gpu pool and one that needs none is
  not (a hub seed only materialises the model; the torch-engine evaluate takes one GPU);
- **Ray**: a verl stage that attaches to a cluster, or spans nodes, names a filesystem every node mounts
  (``verl.shared_dir``, under a path ``infra/ray/cluster.yaml`` mounts on every node and binds into its
  container); its GPUs split into whole rollout tensor-parallel groups.

- **verl validation**: each verl RL stage's job as verl itself checks it (``verl.validate.validate_job``),
  and what a real run needs beyond it: the trainer's imports (TransferQueue for the v1 trainer), the
  rollout and replay buffer it names, sequence parallelism only with flash-attention (the only attention
  verl patches for it), the torch rollout only on the CPU platform;
- **checkpoint disk**: the checkpoints a verl stage keeps, plus its output, within ``orchestration.gpu.disk_gib``;
- **SGLang API key**: a server started with ``--api-key`` and every client that talks to it use the same
  key (spec ``api_key_env``, the client's variable, and on the cluster one secret for the server and the
  gpu-pool jobs).

A prompt longer than ``<stage>.verl.max_prompt_length`` needs the data, so it is refused at launch
(``verl.validate.check_prompt_lengths``), before anything is submitted.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from components.config import DECODE_KINDS, ConfigError, PipelineConfig, parallel_r1_stages, pipeline_stages
from components.engine.backends.sglang_client import API_KEY_ENV
from components.evaluation.config import EvaluateConfig
from components.ops.gpus import GpuCatalogue, load_gpu_catalogue
from components.training import memory, time_estimate
from components.training.config import RLStageConfig

# The stage table is the config's (components.config): stage names live in dvc.yaml and its sections only,
# and a check goes over the sections of a kind (``cfg.sections(RLStageConfig)``).


@dataclass(frozen=True)
class Check:
    """One result row: what was checked, for which stage, whether it passed, and why."""

    check: str
    stage: str
    ok: bool
    detail: str


def check_validation_split(cfg: PipelineConfig) -> list[Check]:
    rows = []
    for stage, sc in cfg.sections(RLStageConfig).items():
        # the held-out split the RL stages evaluate on: val when sample_orz writes one, else test
        held_out = cfg.sample_orz.val_n or cfg.sample_orz.test_n
        split = "val" if cfg.sample_orz.val_n else "test"
        ok = held_out > 0
        detail = (
            f"{held_out} held-out problems of the {split} split ({stage}.eval_n = {sc.eval_n})"
            if ok
            else f"sample_orz.val_n and sample_orz.test_n are 0: {stage} evaluates on the held-out split (verl: "
            "data.val_files) and would get none; set sample_orz.val_n > 0"
        )
        rows.append(Check("validation split", stage, ok, detail))
    return rows


def check_memory(cfg: PipelineConfig) -> list[Check]:
    """Each stage's peak against ``orchestration.gpu`` with ``memory.MIN_HEADROOM`` of it left free."""
    gpu = cfg.orchestration.gpu
    capacity = memory.capacity_bytes(gpu)
    rows = []
    for stage in pipeline_stages():
        try:
            plans = memory.plan_stage(stage, cfg)
        except memory.MemoryPlanError as err:
            rows.append(Check("memory plan", stage, False, str(err)))
            continue
        if not plans:
            continue
        found = memory.problems(plans, capacity, gpu.name, memory.MIN_HEADROOM)
        if found:
            rows.append(Check("memory plan", stage, False, "; ".join(found)))
        else:
            peak = max(plans, key=lambda p: p.total_bytes)
            rows.append(
                Check(
                    "memory plan",
                    stage,
                    True,
                    f"peak {peak.total_bytes / memory.GIB:.1f} of {capacity / memory.GIB:.1f} GiB per "
                    f"{gpu.name}, {memory.headroom(peak, capacity):.0%} headroom ({peak.phase})",
                )
            )
    return rows


@dataclass(frozen=True)
class Sampling:
    """One way the pipeline samples: its stage, its token budget (and that setting's key), and the section
    whose ``verl.max_prompt_length`` bounds its prompts."""

    stage: str
    max_new_tokens: int
    key: str
    prompt_section: str


def _generating_stages(cfg: PipelineConfig) -> list[Sampling]:
    """Every way a stage samples: each RL stage's rollouts (under its own prompt bound), each decode stage
    (under NPR-Zero's: distillation and evaluation prompt as it does), the tiny seed's build, and the
    evaluation of the Parallel-R1 checkpoints with their own budget and their own, longer, instruction
    (the bound of the Parallel-R1 RL stage, which prompts the same way)."""
    rl = cfg.sections(RLStageConfig)
    out = [Sampling(s, sc.max_new_tokens, f"{s}.max_new_tokens", s) for s, sc in rl.items()]
    out += [
        Sampling(s, sc.generation.max_new_tokens, f"{s}.generation.max_new_tokens", "npr_zero")
        for s, sc in cfg.sections(DECODE_KINDS).items()
    ]
    pr1 = set(parallel_r1_stages())
    pr1_rl = [s for s in rl if s in pr1]
    if cfg.parallel_r1.max_new_tokens is not None and pr1_rl:
        out += [
            Sampling(s, cfg.parallel_r1.max_new_tokens, "parallel_r1.max_new_tokens", pr1_rl[0])
            for s, sc in cfg.sections(EvaluateConfig).items()
            if pr1 & set(sc.checkpoints)
        ]
    if cfg.models.base_model == "tiny" and cfg.seed.enabled:
        out.append(Sampling("seed", cfg.seed.max_new_tokens, "seed.max_new_tokens", "npr_zero"))
    return out


def check_context_length(cfg: PipelineConfig) -> list[Check]:
    shape = memory.model_shape(cfg.models)
    rl = cfg.sections(RLStageConfig)
    decoders = cfg.sections(DECODE_KINDS)
    rows = []
    for sampling in _generating_stages(cfg):
        stage, max_new, key = sampling.stage, sampling.max_new_tokens, sampling.key
        prompt = memory.prompt_bound(memory.plan_context(cfg), rl.get(sampling.prompt_section))
        bound_key = f"{sampling.prompt_section}.verl.max_prompt_length"
        need = prompt + max_new
        problems = []
        if shape.max_positions and need > shape.max_positions:
            problems.append(
                f"prompt bound {prompt} ({bound_key}) + {key} {max_new} = {need} exceeds "
                f"the model's {shape.max_positions} positions"
            )
        server = None
        gen = decoders[stage].generation if stage in decoders else None
        if gen is not None and gen.backend == "sglang":
            spec = memory.sglang_spec(gen)
            server = spec.get("context_length")
            if server is not None and int(server) < need:
                problems.append(
                    f"the SGLang server's context_length {server} "
                    f"({getattr(gen, 'server_spec', memory.DEFAULT_SGLANG_SPEC)}) "
                    f"is below prompt bound {prompt} + {key} {max_new} = {need}: the server rejects "
                    f"any prompt over {int(server) - max_new} tokens; raise context_length or lower {key}"
                )
        detail = "; ".join(problems) or (
            f"{prompt} + {max_new} ({key}) = {need} tokens within {shape.max_positions or '?'} positions"
            + (f" and the server's {server}" if server is not None else "")
        )
        rows.append(Check("context length", stage, not problems, detail))
    return rows


def check_gpu_counts(cfg: PipelineConfig) -> list[Check]:
    orch = cfg.orchestration
    rows = []
    for stage in pipeline_stages():
        try:
            gpus = memory.gpus_for(stage, cfg)
        except memory.MemoryPlanError as err:
            rows.append(Check("GPU count", stage, False, str(err)))
            continue
        on_gpu_pool = stage in orch.gpu_stages
        if gpus == 0 and on_gpu_pool:
            why = (
                "it only materialises the hub model"
                if stage == "seed"
                else "its job needs no GPU here (a verl stage attached to a running Ray cluster, or CPU work)"
            )
            rows.append(
                Check(
                    "GPU count",
                    stage,
                    False,
                    f"placed on the gpu pool but {why}: remove it from orchestration.gpu_stages",
                )
            )
        elif gpus > 0 and not on_gpu_pool:
            rows.append(
                Check(
                    "GPU count",
                    stage,
                    False,
                    f"needs {gpus} GPU(s) but runs on the cpu pool: add it to orchestration.gpu_stages",
                )
            )
        elif gpus > orch.gpu.per_node:
            rows.append(
                Check(
                    "GPU count",
                    stage,
                    False,
                    f"asks for {gpus} GPUs, a node has {orch.gpu.per_node} (orchestration.gpu.per_node)",
                )
            )
        else:
            rows.append(Check("GPU count", stage, True, f"{gpus} GPU(s) on the {orch.pool_for(stage)} pool"))
    return rows


RAY_CLUSTER = "infra/ray/cluster.yaml"


def ray_shared_mounts(cluster: dict[str, Any]) -> list[str]:
    """The container paths a Ray cluster YAML binds from its nodes (``docker.run_options``' ``-v HOST:PATH``)
    that its ``initialization_commands`` mount on every node first: where a shared filesystem is seen."""
    options = (cluster.get("docker") or {}).get("run_options") or []
    commands = [str(c) for c in cluster.get("initialization_commands") or []]
    out = []
    for option in options:
        parts = str(option).split()
        if len(parts) != 2 or parts[0] not in ("-v", "--volume"):
            continue
        host, _, inside = parts[1].partition(":")
        # a `mount ... <host>` on the node (not `mountpoint`, not `mkdir`): the host folder is a real mount
        mounted = re.compile(rf"\bmount\b[^;&|]*\s{re.escape(host)}(?=[\s)]|$)")
        if inside and any(mounted.search(c) for c in commands):
            out.append(inside.split(":")[0])
    return out


def _under(path: str, roots: list[str]) -> bool:
    return any(Path(path) == Path(r) or Path(r) in Path(path).parents for r in roots)


def check_ray(cfg: PipelineConfig, root: Any = None) -> list[Check]:
    """See the module docstring; ``root``: the checkout whose ``infra/ray/cluster.yaml`` the cluster runs."""
    cluster = yaml.safe_load((Path(root or ".") / RAY_CLUSTER).read_text())
    shared = ray_shared_mounts(cluster)
    rows = []
    for stage, sc in cfg.sections(RLStageConfig).items():
        if sc.backend != "verl":
            continue
        v = sc.verl
        problems = []
        if (v.nnodes > 1 or v.ray_address) and not v.shared_dir:
            where = (
                "spans several nodes" if v.nnodes > 1 else f"attaches to the Ray cluster at {v.ray_address}"
            )
            problems.append(
                f"{stage} {where}, so its workers cannot read the submitting node's files: set "
                f"{stage}.verl.shared_dir to a filesystem every Ray node mounts"
            )
        elif (v.nnodes > 1 or v.ray_address) and not _under(v.shared_dir, shared):
            problems.append(
                f"{stage}.verl.shared_dir {v.shared_dir} is not on a filesystem {RAY_CLUSTER} mounts on every "
                f"node ({', '.join(shared) or 'none'}): each Ray worker would see its own empty folder there"
            )
        if v.nnodes > 1 and not v.ray_address:
            problems.append(
                f"{stage}.verl.nnodes is {v.nnodes}: a head started by the stage is one node; set {stage}.verl.ray_address"
            )
        total = v.nnodes * v.n_gpus_per_node
        if total % v.rollout_tp:
            problems.append(
                f"{total} GPUs do not split into rollout groups of {v.rollout_tp} ({stage}.verl.rollout_tp)"
            )
        if v.n_gpus_per_node > cfg.orchestration.gpu.per_node:
            problems.append(
                f"{stage}.verl.n_gpus_per_node {v.n_gpus_per_node} exceeds orchestration.gpu.per_node {cfg.orchestration.gpu.per_node}"
            )
        mode = f"attach {v.ray_address}" if v.ray_address else f"start a head on {v.ray_head_host}"
        rows.append(
            Check(
                "Ray",
                stage,
                not problems,
                "; ".join(problems) or f"{mode}, {v.nnodes} x {v.n_gpus_per_node} GPUs",
            )
        )
    return rows


def check_verl(cfg: PipelineConfig) -> list[Check]:
    """verl's own validation of each verl RL stage's job (``verl.validate.validate_job``: verl's
    ``validate_config`` as ``main_ppo`` calls it, and every plugin the job names resolved)."""
    from components.training.verl.job import build_job  # lazy: pandas, pyarrow (its parquet inputs)
    from components.training.verl.validate import validate_job  # lazy: verl

    rows = []
    for stage, sc in cfg.sections(RLStageConfig).items():
        if sc.backend != "verl":
            continue
        try:
            summary = validate_job(build_job(stage, cfg)).summary()
        except ConfigError as err:
            rows.append(Check("verl validation", stage, False, str(err)))
            continue
        shown = {k: v for k, v in summary.items() if k not in ("stage", "env_vars", "overrides")}
        detail = ", ".join(f"{k} {v}" for k, v in list(shown.items())[:4])
        rows.append(Check("verl validation", stage, True, f"verl accepts the job ({detail})"))
    return rows


# verl's FSDP checkpoint of an actor: fp32 weights (4 bytes a parameter) and AdamW's two fp32 moments (8)
CHECKPOINT_BYTES_PER_PARAM = 12
MERGED_BYTES_PER_PARAM = 2  # the stage's output: verl's model merger writes bf16


def check_checkpoint_disk(cfg: PipelineConfig) -> list[Check]:
    """The checkpoints a verl stage keeps (``verl.keep_checkpoints``, verl's ``max_actor_ckpt_to_keep``;
    verl's own default keeps every one) plus its merged output fit the node's declared disk
    (``orchestration.gpu.disk_gib``)."""
    shape = memory.model_shape(cfg.models)
    disk = cfg.orchestration.gpu.disk_gib * 2**30
    rows = []
    for stage, sc in cfg.sections(RLStageConfig).items():
        if sc.backend != "verl":
            continue
        saves = max(1, sc.steps // max(1, sc.save_every))
        kept = min(sc.verl.keep_checkpoints, saves)
        need = kept * CHECKPOINT_BYTES_PER_PARAM * shape.params + MERGED_BYTES_PER_PARAM * shape.params
        ok = need <= disk
        gib = need / 2**30
        detail = (
            f"{kept} checkpoint(s) of {CHECKPOINT_BYTES_PER_PARAM * shape.params / 2**30:.1f} GiB + the merged "
            f"model = {gib:.1f} of {cfg.orchestration.gpu.disk_gib:.0f} GiB (orchestration.gpu.disk_gib)"
        )
        if not ok:
            detail += f": lower {stage}.verl.keep_checkpoints ({saves} saves in {sc.steps} steps)"
        rows.append(Check("checkpoint disk", stage, ok, detail))
    return rows


def stage_estimates(cfg: PipelineConfig, catalogue: GpuCatalogue) -> dict[str, time_estimate.StageEstimate]:
    """Each GPU stage's estimated wall time on the profile's GPU (``orchestration.gpu``, a kind of
    ``infra/gpus.yaml``), by stage; empty for a profile without GPU stages."""
    gpu = cfg.orchestration.gpu
    out = {}
    for stage in pipeline_stages():
        if not memory.plan_stage(stage, cfg):
            continue
        estimate = time_estimate.estimate_stage(
            stage, cfg, gpu, catalogue.kind(gpu.name), catalogue.time_model
        )
        if estimate is not None:
            out[stage] = estimate
    return out


def check_time(cfg: PipelineConfig) -> list[Check]:
    """Each GPU stage's estimated wall time (``components.training.time_estimate``), and its timeout
    (``orchestration.task_timeout_s``) at least ``time_model.timeout_margin`` times that."""
    catalogue = load_gpu_catalogue()
    margin = catalogue.time_model.timeout_margin
    rows = []
    for stage, est in stage_estimates(cfg, catalogue).items():
        timeout = cfg.orchestration.timeout_for(stage)
        where = f"on {cfg.orchestration.gpu.name}"
        if math.isnan(est.seconds):
            rows.append(Check("time estimate", stage, False, f"no estimate {where}: {est.basis}"))
            continue
        need = math.ceil(est.seconds * margin)
        ok = timeout >= need
        detail = f"{est.hours:.1f} h {where} ({est.basis}); timeout {timeout / 3600:.1f} h"
        if not ok:
            detail += f" is below {margin}x the estimate: set orchestration.task_timeout_s.{stage} >= {need}"
        rows.append(Check("time estimate", stage, ok, detail))
    return rows


def _peak_headroom(cfg: PipelineConfig, stage: str) -> float:
    capacity = memory.capacity_bytes(cfg.orchestration.gpu)
    return min(memory.headroom(p, capacity) for p in memory.plan_stage(stage, cfg))


def estimate_table(configs: list[PipelineConfig], catalogue: GpuCatalogue | None = None) -> str:
    """A markdown table: each GPU profile on each GPU kind of ``infra/gpus.yaml``, each GPU stage's
    estimated hours and the memory headroom of its peak phase ("no fit" below ``memory.MIN_HEADROOM``),
    and the sum of the hours (README's table is this output: ``npr config estimate``)."""
    catalogue = catalogue or load_gpu_catalogue()
    runs = [(cfg, on_gpu(cfg, kind, catalogue)) for cfg in configs for kind in catalogue.kinds]
    runs = [
        (declared, cfg) for declared, cfg in runs if any(memory.plan_stage(s, cfg) for s in pipeline_stages())
    ]
    stages = [s for s in pipeline_stages() if any(memory.plan_stage(s, cfg) for _, cfg in runs)]
    lines = [
        "| profile | GPUs | " + " | ".join(stages) + " | total h |",
        "|---|---|" + "---|" * len(stages) + "---|",
    ]
    for declared, cfg in runs:
        gpu = cfg.orchestration.gpu
        estimates = stage_estimates(cfg, catalogue)
        cells, total = [], 0.0
        for stage in stages:
            est, room = estimates.get(stage), _peak_headroom(cfg, stage)
            if est is None:
                cells.append("-")
                continue
            total += est.hours
            fits = f"{room:.0%}" if room >= memory.MIN_HEADROOM else "no fit"
            cells.append(f"{est.hours:.1f} h, {fits}")
        mark = "" if gpu.name == declared.orchestration.gpu.name else " (not declared)"
        lines.append(
            f"| {cfg.profile} | {gpu.per_node} x {gpu.name}{mark} | "
            + " | ".join(cells)
            + f" | {total:.0f} |"
        )
    return "\n".join(lines) + "\n"


SGLANG_SERVER_MANIFEST = "infra/k8s/sglang-server.yaml"
GPU_POOL_TEMPLATE = "infra/k8s/gpu-pool-template.json"


def _secret_ref_of_server_key(manifest: Any, env_name: str) -> tuple[str, str] | None:
    """(secret, key) the cluster's SGLang server reads ``env_name`` from, in its Deployment."""
    for doc in manifest:
        if not isinstance(doc, dict) or doc.get("kind") != "Deployment":
            continue
        for container in doc["spec"]["template"]["spec"].get("containers", []):
            for env in container.get("env", []):
                ref = (env.get("valueFrom") or {}).get("secretKeyRef")
                if env.get("name") == env_name and ref:
                    return ref.get("name"), ref.get("key")
    return None


def _job_secrets(template: Any) -> set[str]:
    """The secrets a gpu-pool job container takes its whole environment from (``envFrom``)."""
    spec = template["job_configuration"]["job_manifest"]["spec"]["template"]["spec"]
    return {
        ref["secretRef"]["name"]
        for container in spec.get("containers", [])
        for ref in container.get("envFrom", [])
        if "secretRef" in ref
    }


def check_sglang_api_key(cfg: PipelineConfig, root: Any = None) -> list[Check]:
    """A server that requires a key and every client that talks to it use the same key: the server spec's
    ``api_key_env`` is the variable the client sends (``sglang_client.API_KEY_ENV``); and on the cluster the
    SGLang Deployment reads the key from a secret entry named like that variable, in a secret the gpu-pool
    jobs take their environment from (so distill and evaluate there hold it)."""
    root = Path(root or ".")
    rows = []
    for stage, section in cfg.sections(DECODE_KINDS).items():
        gen = section.generation
        if gen.backend != "sglang":
            continue
        spec = {**memory.sglang_spec(gen), **dict(gen.server_args)}
        key_env = spec.get("api_key_env")
        problems = []
        if key_env and key_env != API_KEY_ENV:
            problems.append(
                f"the server reads its key from {key_env} ({gen.server_spec} / {stage}.generation.server_args), "
                f"the client sends {API_KEY_ENV}: every request would get HTTP 401"
            )
        if key_env and stage in cfg.orchestration.gpu_stages:
            manifest = list(yaml.safe_load_all((root / SGLANG_SERVER_MANIFEST).read_text()))
            template = json.loads((root / GPU_POOL_TEMPLATE).read_text())
            ref = _secret_ref_of_server_key(manifest, API_KEY_ENV)
            secrets = _job_secrets(template)
            if ref is None:
                problems.append(f"{SGLANG_SERVER_MANIFEST} does not read {API_KEY_ENV} from a secret")
            elif ref[0] not in secrets or ref[1] != API_KEY_ENV:
                problems.append(
                    f"the cluster's server reads secret {ref[0]}/{ref[1]} but gpu-pool jobs take their "
                    f"environment from {sorted(secrets)} ({GPU_POOL_TEMPLATE}): they would not hold {API_KEY_ENV}; "
                    f"keep the key in one of those secrets under the name {API_KEY_ENV}"
                )
        detail = "; ".join(problems) or (
            f"server and clients use {API_KEY_ENV}" if key_env else "the server requires no key (loopback)"
        )
        rows.append(Check("SGLang API key", stage, not problems, detail))
    return rows


CHECKS = (
    check_validation_split,
    check_memory,
    check_context_length,
    check_gpu_counts,
    check_ray,
    check_verl,
    check_checkpoint_disk,
    check_sglang_api_key,
    check_time,
)


def on_gpu(cfg: PipelineConfig, kind: str, catalogue: GpuCatalogue | None = None) -> PipelineConfig:
    """``cfg`` planned against GPU kind ``kind`` of ``infra/gpus.yaml`` instead of the one it declares (its
    node layout, reserve and disk kept)."""
    catalogue = catalogue or load_gpu_catalogue()
    gpu = catalogue.spec(kind, cfg.orchestration.gpu)
    return cfg.model_copy(update={"orchestration": cfg.orchestration.model_copy(update={"gpu": gpu})})


def check_profile(cfg: PipelineConfig, gpu: str | None = None) -> list[Check]:
    """Every static check of ``cfg`` (see the module docstring), in a stable order; ``gpu``: against that
    GPU kind (``on_gpu``) instead of ``orchestration.gpu``."""
    if gpu is not None:
        cfg = on_gpu(cfg, gpu)
    return [row for check in CHECKS for row in check(cfg)]
