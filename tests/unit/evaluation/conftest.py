"""Canned evaluation results for the gate and nightly tests (the shape evaluate returns)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from components.config import load_config
from components.evaluation.config import NightlyConfig

SETTINGS = {
    "sampling": {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_new_tokens": 96, "seed": 0, "merge_semantics": "isolated"},
    "prompt_hash": "abc123",
    "engine_version": {
        "npr_pipeline": "0.1.0",
        "torch": "2.13.0",
        "transformers": "5.10.4",
        "backend": "torch",
    },
}


def bench_metrics(accuracy: float, **overrides: float) -> dict[str, Any]:
    m: dict[str, Any] = {
        "n_problems": 200,
        "n_samples": 4,
        "k": 4,
        "accuracy": accuracy,
        "pass@k": min(1.0, accuracy + 0.2),
        "format_valid_rate": 0.97,
        "parallel_rate": 0.95,
        "parallel_rate_any": 0.99,
        "mean_branches_per_block": 2.5,
        "mean_tokens": 60.0,
        "truncation_rate": 0.01,
        "ideal_speedup": 1.8,
        "tokens_per_s": 2000.0,
    }
    m.update(overrides)
    return m


@pytest.fixture()
def make_eval() -> Callable[..., dict[str, Any]]:
    """An evaluation's metrics for one checkpoint `papo_rl` on benchmark `tiny_test`."""

    def make(accuracy: float = 0.60, mode: str = "parallel", **overrides: Any) -> dict[str, Any]:
        settings = copy.deepcopy(SETTINGS)
        settings.update(overrides.pop("settings", {}))
        ckpt_hash = overrides.pop("checkpoint_hash", "sha256:feed")
        return {
            "settings": settings,
            "checkpoints": {
                "papo_rl": {
                    "mode": mode,
                    "prompt_style": overrides.pop("prompt_style", "parallel"),
                    "checkpoint_hash": ckpt_hash,
                    "path": "artifacts/papo_rl/model",
                    "benchmarks": {"tiny_test": bench_metrics(accuracy, **overrides)},
                    "average_accuracy": accuracy,
                    "throughput": {"tokens_per_s": 2000.0, "ideal_speedup": 1.8, "mean_tokens": 60.0},
                }
            },
        }

    return make


@pytest.fixture()
def tiny_cfg(in_repo: Any) -> Any:
    return load_config(profile="tiny")


@pytest.fixture()
def nightly_cfg() -> NightlyConfig:
    return NightlyConfig(tolerance=0.05, confidence=0.95, format_valid_floor=0.8, parallel_rate_floor=0.8)
