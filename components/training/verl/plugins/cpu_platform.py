"""verl on CPU: a ``cpu`` platform in verl's ``PlatformRegistry``, chosen with ``VERL_PLATFORM=cpu``.

verl 0.9.1 knows CUDA, NPU and ROCm; on a machine with none of them it warns and falls back to "nvidia",
whose device module is ``torch.cuda``. Every device call verl makes goes through the platform
(``verl.utils.device``), so registering a platform is enough to run its trainer on CPU without editing it:

- ``device_name`` is ``cpu``: the FSDP engine builds its device mesh on ``cpu``, moves models and batches
  with ``.to("cpu")``, and the engine registry is asked for the ``cpu`` device key (``plugins.engine``
  registers the stock FSDP engine and the NPR actor under it).
- ``communication_backend_name`` is ``gloo``. verl joins it into ``cpu:gloo,<device>:<backend>``
  (``verl/utils/distributed.py``), which torch rejects as a duplicate ``cpu`` entry, so
  ``initialize_global_process_group_ray`` is wrapped to initialise plain gloo on this platform.
- The device module is ``torch.cpu`` with the calls verl makes on an accelerator module and CPU torch
  lacks (``empty_cache``, memory statistics, RNG state) answered for the CPU: memory from the process's
  resident set and the machine's available memory (``psutil``), the RNG state of the default generator.
- Ray: verl's resource check (``ResourcePoolManager._check_resource_available``) counts only ``GPU`` or
  ``NPU`` resources, and its placement groups ask each worker for one unit of the platform's resource.
  On CPU those units are *device slots*: the Ray head the stage starts declares ``n_gpus_per_node``
  logical GPUs (Ray's resources are scheduling tokens; nothing checks hardware), one per training rank.
  Ray then sets ``CUDA_VISIBLE_DEVICES`` for those workers, which the CPU build of torch ignores.

Auto-detection never picks this platform: it answers ``is_platform_available`` only when
``VERL_PLATFORM=cpu`` names it, which the launcher sets for a job whose ``verl.device`` is ``cpu``.
"""

from __future__ import annotations

import contextlib
import os
import sys
import types
from datetime import timedelta
from typing import Any

import psutil
import torch
import verl.utils.distributed as distributed
from verl.plugin.platform.platform_base import PlatformBase
from verl.plugin.platform.platform_manager import PlatformRegistry

from components.training.verl.plugin_names import CPU_PLATFORM, PLATFORM_ENV

PLATFORM = CPU_PLATFORM
# The Ray resource a CPU training rank holds: a logical device slot (module docstring).
SLOT_RESOURCE = "GPU"


def _memory_allocated(device: Any = None) -> int:
    return int(psutil.Process().memory_info().rss)


def _mem_get_info(device: Any = None) -> tuple[int, int]:
    vm = psutil.virtual_memory()
    return int(vm.available), int(vm.total)


def _noop(*args: Any, **kwargs: Any) -> None:
    return None


def _cpu_device_module() -> types.ModuleType:
    """``torch.cpu`` plus the accelerator-module calls verl makes (see the module docstring)."""
    module = types.ModuleType("npr_verl_cpu_device")
    for name in dir(torch.cpu):
        if not name.startswith("_"):
            setattr(module, name, getattr(torch.cpu, name))
    module.is_available = lambda: True
    module.current_device = lambda: PLATFORM
    module.device_count = lambda: 1
    module.set_device = _noop
    module.synchronize = _noop
    module.empty_cache = _noop
    module.ipc_collect = _noop
    module.set_per_process_memory_fraction = _noop
    module.reset_peak_memory_stats = _noop
    module.memory_allocated = _memory_allocated
    module.memory_reserved = _memory_allocated
    module.max_memory_allocated = _memory_allocated
    module.max_memory_reserved = _memory_allocated
    module.mem_get_info = _mem_get_info
    module.get_device_name = lambda device=None: "cpu"
    module.get_rng_state = lambda device=None: torch.get_rng_state()
    module.set_rng_state = lambda state, device=None: torch.set_rng_state(state)
    module.manual_seed = torch.manual_seed
    module.manual_seed_all = torch.manual_seed
    return module


@PlatformRegistry.register(platform=PLATFORM)
class PlatformCPU(PlatformBase):
    """verl's platform interface answered for the CPU (module docstring)."""

    _device_module = _cpu_device_module()

    @property
    def device_name(self) -> str:
        return PLATFORM

    @property
    def vendor_name(self) -> str:
        return PLATFORM

    @property
    def device_module(self) -> types.ModuleType:
        return self._device_module

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        return os.environ.get(PLATFORM_ENV, "").strip().lower() == PLATFORM

    def current_device(self) -> str:  # type: ignore[override]  # verl passes it to .to() / device=
        return PLATFORM

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: int | None = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        # what Ray sets for a worker holding device slots (SLOT_RESOURCE); verl reads it to place servers
        return "CUDA_VISIBLE_DEVICES"

    @contextlib.contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return SLOT_RESOURCE

    def ray_resource_options(self, num_gpus: float) -> dict[str, Any]:
        return {"num_gpus": num_gpus}

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def rollout_env_vars(self) -> dict[str, str]:
        return {}

    def get_collective_module(self) -> Any:
        return None

    def cudart(self) -> Any:
        return None


def on_cpu_platform() -> bool:
    """Whether this process runs verl on the CPU platform (``VERL_PLATFORM=cpu``)."""
    return os.environ.get(PLATFORM_ENV, "").strip().lower() == PLATFORM


def _gloo_process_group() -> None:
    """On the CPU platform, verl's process-group setup joins a backend string torch rejects
    (``cpu:gloo,cpu:gloo``); wrap it to initialise plain gloo with the same rank/world/timeout."""
    original = distributed.initialize_global_process_group_ray
    if getattr(original, "_npr_cpu", False):
        return

    def initialize_global_process_group_ray(timeout_second: int | None = None, backend: str | None = None):
        if not on_cpu_platform():
            return original(timeout_second=timeout_second, backend=backend)

        if not torch.distributed.is_initialized():
            kwargs = {"timeout": timedelta(seconds=timeout_second)} if timeout_second else {}
            torch.distributed.init_process_group(
                backend="gloo",
                rank=int(os.environ.get("RANK", 0)),
                world_size=int(os.environ.get("WORLD_SIZE", 1)),
                **kwargs,
            )
        return None

    initialize_global_process_group_ray._npr_cpu = True  # type: ignore[attr-defined]
    distributed.initialize_global_process_group_ray = initialize_global_process_group_ray
    # modules that imported the name before this plugin loaded hold the original: rebind it there too
    for name, module in list(sys.modules.items()):
        if name.startswith("verl.") and vars(module).get("initialize_global_process_group_ray") is original:
            module.initialize_global_process_group_ray = initialize_global_process_group_ray


_gloo_process_group()

__all__ = ["PLATFORM", "PLATFORM_ENV", "SLOT_RESOURCE", "PlatformCPU", "on_cpu_platform"]
