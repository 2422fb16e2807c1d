"""The GPU kinds the project plans against (``infra/gpus.yaml``): memory, datasheet throughput and the
cloud instance types that carry them.

``npr config check --gpu KIND`` plans a profile against a kind other than the one it declares
(``orchestration.gpu``), and the tests plan every profile against every kind infra/ names.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, ValidationError

from components.ops.config import GpuSpec
from components.settings import ConfigError, StrictModel, load_yaml_text

GPU_KINDS_FILE = Path("infra/gpus.yaml")


class GpuKind(StrictModel):
    """One GPU model: what it reports as its memory, its datasheet peaks, the instance types with it."""

    memory_gib: float = Field(gt=0)
    bf16_tflops: float = Field(gt=0)  # dense BF16 tensor-core peak, TFLOP/s
    hbm_tb_s: float = Field(gt=0)  # memory bandwidth, TB/s
    instance_types: list[str] = []


class TimeModel(StrictModel):
    """The time estimate's assumptions (components.training.time_estimate): shares of the datasheet peaks,
    the rows of data sets a profile does not size, and the margin a timeout keeps over its estimate."""

    train_mfu: float = Field(gt=0, le=1)
    decode_bandwidth: float = Field(gt=0, le=1)
    decode_mfu: float = Field(gt=0, le=1)
    data_rows: dict[str, int] = {}
    timeout_margin: float = Field(ge=1)


class GpuCatalogue(StrictModel):
    kinds: dict[str, GpuKind]
    time_model: TimeModel

    def kind(self, name: str) -> GpuKind:
        """The kind called ``name``; an unknown name is a ConfigError listing the known ones."""
        if name not in self.kinds:
            raise ConfigError(f"unknown GPU kind {name!r} ({GPU_KINDS_FILE}); known: {', '.join(self.kinds)}")
        return self.kinds[name]

    def for_instance_type(self, instance_type: str) -> str | None:
        """The kind an instance type carries (None: not a GPU instance type this catalogue knows)."""
        return next((n for n, k in self.kinds.items() if instance_type in k.instance_types), None)

    def spec(self, name: str, declared: GpuSpec) -> GpuSpec:
        """``declared`` (a profile's ``orchestration.gpu``) with the name and memory of kind ``name``: the
        same node layout, reserve and disk, another GPU."""
        return declared.model_copy(update={"name": name, "memory_gib": self.kind(name).memory_gib})


def load_gpu_catalogue(path: Path = GPU_KINDS_FILE) -> GpuCatalogue:
    if not path.exists():
        raise ConfigError(f"GPU catalogue {path} does not exist")
    try:
        return GpuCatalogue.model_validate(load_yaml_text(path.read_text(), str(path)))
    except ValidationError as err:
        raise ConfigError(f"{path}: {err.errors()[0]['loc']}: {err.errors()[0]['msg']}") from None
