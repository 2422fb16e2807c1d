"""Config of storage (DVC/S3), tracking (W&B) and orchestration (Prefect) (owned by components/ops)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from components.settings import StrictModel


class StorageConfig(StrictModel):
    """Where stage outputs live besides the workspace, and how hard to try to put them there."""

    # Name of a DVC remote in .dvc/config (`local` = <repo>/dvc-remote, `s3` = the S3 bucket).
    remote: str = "local"
    push_after_stage: bool = True
    # Pull a stage's upstream artifacts from the remote when they are not in the workspace.
    pull_inputs: bool = True
    # Extra attempts after the first failed push/pull; waits backoff_s * 2**i, capped at max_backoff_s.
    retries: int = Field(3, ge=0)
    backoff_s: float = Field(2.0, ge=0)
    max_backoff_s: float = Field(60.0, ge=0)
    # Parallel transfers per push/pull (None: DVC's default, 4 x cores).
    jobs: int | None = Field(None, ge=1)


class TrackingConfig(StrictModel):
    """W&B: one run per stage, grouped by pipeline run; artifacts are references, never uploads."""

    project: str = "npr-pipeline"
    entity: str | None = None
    # auto: online when WANDB_API_KEY is set (or WANDB_MODE says so), offline otherwise.
    mode: Literal["auto", "offline", "online", "disabled"] = "auto"
    # W&B's stdout/stderr capture; "off" keeps a stage's console untouched.
    console: Literal["auto", "off", "wrap", "redirect"] = "auto"


class GpuSpec(StrictModel):
    """The GPUs of the gpu pool's nodes: what the memory plan of each stage is checked against
    (`npr config check`; at run time a stage checks against the device it got)."""

    name: str = "H200"
    # What torch reports as the device's total memory (an H200: 143,771 MiB = 140.4 GiB).
    memory_gib: float = Field(140.0, gt=0)
    per_node: int = Field(8, ge=1)
    # Held back from every plan: the CUDA context, NCCL buffers and the caching allocator's fragmentation.
    reserved_gib: float = Field(4.0, ge=0)
    # Local disk of a node for a stage's work dir (verl's checkpoints: ~12 bytes a parameter each, weights
    # and AdamW state in fp32), checked against the checkpoints a verl stage keeps (`npr config check`).
    disk_gib: float = Field(1000.0, gt=0)


class OrchestrationConfig(StrictModel):
    """Prefect: work pools, where each stage runs, and how long it may take."""

    # Stages dispatched to the gpu pool (through the npr-stage deployment); the rest run on the cpu pool.
    gpu_stages: list[str] = []
    task_timeout_s: dict[str, int] = {}
    default_timeout_s: int = Field(6 * 3600, ge=60)
    retries: int = Field(1, ge=0)
    retry_delay_s: int = Field(30, ge=0)
    cpu_pool: str = "cpu"
    gpu_pool: str = "gpu"
    # Pool of the nightly-eval deployment: the gpu pool for real checkpoints, cpu for the tiny profile.
    # (The gpu pool's image and GPU count are job variables of the npr-stage deployment in prefect.yaml.)
    nightly_pool: Literal["cpu", "gpu"] = "cpu"
    # Stages the pipeline flow may run at once (independent DAG branches; DVC and the flow keep them apart).
    # Stages that can overlap then share the machine's torch threads (run.torch_threads divided by this),
    # so two stages never oversubscribe the cores (measured: 2+2 threads on 2 cores ran 13x slower).
    max_parallel_stages: int = Field(1, ge=1)
    # How long `npr server` waits for the API to answer /api/health.
    server_start_timeout_s: int = Field(120, ge=5)
    # The gpu pool's GPUs (memory plans, GPU counts per stage: components.training.memory).
    gpu: GpuSpec = GpuSpec()

    @model_validator(mode="after")
    def _timeouts_positive(self) -> OrchestrationConfig:
        bad = {k: v for k, v in self.task_timeout_s.items() if v < 60}
        if bad:
            raise ValueError(f"task_timeout_s must be >= 60 s per stage; got {bad}")
        return self

    def timeout_for(self, stage: str) -> int:
        """Seconds a stage's task may run before Prefect fails it."""
        return self.task_timeout_s.get(stage, self.default_timeout_s)

    def pool_for(self, stage: str) -> str:
        """The work pool a stage runs on."""
        return self.gpu_pool if stage in self.gpu_stages else self.cpu_pool
