"""The hook targets an NPR-merge plugin for SGLang would use exist in the pinned SGLang's source.

Reads the sglang wheel pinned in pyproject's gpu lock (downloaded with pip into a cache folder, never
installed or imported); skips with the reason when the package registry cannot be reached.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
CACHE = Path(os.environ.get("NPR_SGLANG_WHEEL_CACHE", Path.home() / ".cache" / "npr-sglang-wheel"))


def _pinned_version() -> str:
    match = re.search(r'"sglang==([0-9.]+)"', (ROOT / "pyproject.toml").read_text())
    assert match, "pyproject's gpu lock no longer pins sglang"
    return match.group(1)


@pytest.fixture(scope="module")
def sglang_source() -> zipfile.ZipFile:
    version = _pinned_version()
    CACHE.mkdir(parents=True, exist_ok=True)
    wheels = sorted(CACHE.glob(f"sglang-{version}-*.whl"))
    if not wheels:
        try:
            proc = subprocess.run(
                [sys.executable, "-m", "pip", "download", f"sglang=={version}", "--no-deps", "-d", str(CACHE)],
                capture_output=True, text=True, timeout=300,
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            pytest.skip(f"cannot download sglang=={version}: the package registry did not answer in 300 s")
        wheels = sorted(CACHE.glob(f"sglang-{version}-*.whl"))
        if proc.returncode != 0 or not wheels:
            pytest.skip(f"cannot download sglang=={version}: {proc.stderr.strip()[-300:]}")
    return zipfile.ZipFile(wheels[-1])


def _read(wheel: zipfile.ZipFile, path: str) -> str:
    return wheel.read(f"sglang/srt/{path}").decode()


def test_plugins_are_loaded_in_every_scheduler_process(sglang_source):
    plugins = _read(sglang_source, "plugins/__init__.py")
    assert 'GENERAL_PLUGINS_GROUP = "sglang.srt.plugins"' in plugins
    assert "HookRegistry.apply_hooks()" in plugins
    scheduler = _read(sglang_source, "managers/scheduler.py")
    run = scheduler.split("def run_scheduler_process(", 1)[1]
    assert run.index("load_plugins()") < run.index("configure_scheduler_process(")
    hooks = _read(sglang_source, "plugins/hook_registry.py")
    for kind in ("BEFORE", "AFTER", "AROUND", "REPLACE"):
        assert f'{kind} = "{kind.lower()}"' in hooks


def test_the_merge_hook_targets_exist(sglang_source):
    radix = _read(sglang_source, "mem_cache/radix_cache.py")
    assert "class RadixCache(" in radix and "def match_prefix(self, params: MatchPrefixParams)" in radix
    # the request reaches match_prefix (its sampling_params.custom_params can carry the response start)
    batch = _read(sglang_source, "managers/schedule_batch.py")
    assert "req=self," in batch and "custom_params" in batch
    fb = _read(sglang_source, "model_executor/forward_batch_info.py")
    assert "    def init_new(\n        cls," in fb and "ret.positions = clamp_position(batch.seq_lens)" in fb
    graphs = _read(sglang_source, "model_executor/cuda_graph_runner.py")
    assert "forward_batch.positions" in graphs  # CUDA-graph decode copies the positions init_new built
    triton = _read(sglang_source, "layers/attention/triton_backend.py")
    assert "def init_forward_metadata(self, forward_batch: ForwardBatch)" in triton
    assert "custom_mask" in triton and "mask_indptr" in triton
    kernel = _read(sglang_source, "layers/attention/triton_ops/extend_attention.py")
    # the prefix part of a custom mask is skipped by default: a merge's extend must start at the fork point
    assert "skip_prefix_custom_mask=True" in kernel
