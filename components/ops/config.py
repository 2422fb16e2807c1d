"""Config of storage (DVC/S3), tracking (W&B) and orchestration (Prefect) (owned by components/ops)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from components.settings import StrictModel


class StorageConfig(StrictModel):
    remote: str = "local"  # name of the DVC remote in .dvc/config
    push_after_stage: bool = True
    retries: int = Field(3, ge=0)
    backoff_s: float = Field(2.0, ge=0)


class TrackingConfig(StrictModel):
    project: str = "npr-pipeline"
    entity: str | None = None
    mode: Literal["auto", "offline", "online", "disabled"] = "auto"


class OrchestrationConfig(StrictModel):
    gpu_stages: list[str] = []
    task_timeout_s: dict[str, int] = {}
    default_timeout_s: int = Field(6 * 3600, ge=60)
    retries: int = Field(1, ge=0)
