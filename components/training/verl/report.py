"""What an RL stage reports from its verl run, in the local trainer's vocabulary.

Two sources, both written during the job:

- verl's own per-step metrics, from its ``file`` logger (``trainer.logger`` includes ``file``; one JSON line
  ``{"step": n, "data": {...}}`` per step, at ``VERL_FILE_LOGGER_PATH``). The stage gives every attempt of the
  job its own file (``verl_logs/attempt-NN.jsonl``: verl opens the file for writing, so a resumed attempt
  would otherwise erase what the killed one logged); a step logged by several attempts keeps the last.
- the per-rollout records of the plugins (``plugins.rollout_log``), tagged with the attempt that wrote them;
  for each step the records of the last attempt that reached it count (a step replayed after a resume is
  counted once).

``step_records`` turns them into one record per step, as ``components.training.rl`` logs them
(``metrics.jsonl`` in the stage's work dir: the training curves of ``components.reporting`` read it), with
the held-out evaluation of that step under ``eval`` and every verl metric of the step under ``verl/``.
``summarize`` gives the stage's metrics: the local trainer's keys (``final/*``, ``initial/*``, ``delta/*``,
``evals``, ``train/*``, ``perf/tokens_per_s``) from these records.

verl's held-out metrics are means over its validation set per reward key
(``val-core|val-aux/<data source>/<key>/mean@<n>``): the reward function returns ``acc``, ``valid``,
``correct_and_valid`` and ``parallel`` per response, which become ``accuracy``, ``format_valid``,
``correct_and_valid`` and ``parallel_rate`` (averaged over data sources).
"""

from __future__ import annotations

import json
import math
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from components.training.verl.plugins.rollout_log import ATTEMPT_ENV, LOG_DIR_ENV, read_rollouts

LOG_DIR = "verl_logs"
ROLLOUT_DIR = "rollouts"
FILE_LOGGER_ENV = "VERL_FILE_LOGGER_PATH"  # verl's FileLogger reads it (verl/utils/tracking.py)
_VAL = re.compile(r"^val-(?:core|aux)/(?P<source>[^/]+)/(?P<key>[^/]+)/mean@(?P<n>\d+)$")
EVAL_KEYS = {"acc": "accuracy", "valid": "format_valid", "correct_and_valid": "correct_and_valid", "parallel": "parallel_rate"}
TRAIN_KEYS = {
    "critic/score/mean": "reward/mean",
    "critic/score/max": "reward/max",
    "critic/score/min": "reward/min",
    "actor/pg_loss": "actor/pg_loss",
    "actor/grad_norm": "actor/grad_norm",
    "response_length/mean": "response_length/mean",
    "response_length/clip_ratio": "response_length/clip_ratio",
    "timing_s/step": "timing_s/step",
    "timing_s/gen": "timing_s/rollout",
    "timing_s/update_actor": "timing_s/update",
}


def attempt_paths(run_dir: Path) -> list[Path]:
    """The file-logger files of the job's attempts so far, oldest first."""
    return sorted((Path(run_dir) / LOG_DIR).glob("attempt-*.jsonl"))


def next_attempt(run_dir: Path) -> tuple[int, Path]:
    """The number and file-logger path of the next attempt."""
    k = len(attempt_paths(run_dir)) + 1
    return k, Path(run_dir) / LOG_DIR / f"attempt-{k:02d}.jsonl"


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, int | float) and math.isfinite(float(value)):
        return float(value)
    return None


def verl_steps(run_dir: Path) -> dict[int, dict[str, float]]:
    """verl's numeric metrics per step, merged over attempts (a later attempt's step replaces an earlier one)."""
    steps: dict[int, dict[str, float]] = {}
    for path in attempt_paths(run_dir):
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:  # a line cut short by a kill
                continue
            step, data = row.get("step"), row.get("data")
            if not isinstance(step, int) or not isinstance(data, Mapping):
                continue
            numbers = {k: n for k, v in data.items() if (n := _number(v)) is not None}
            steps.setdefault(step, {}).update(numbers)
    return steps


def rollouts_by_step(run_dir: Path) -> dict[int, list[dict[str, Any]]]:
    """The training rollouts of each step, from the last attempt that reached the step."""
    by_attempt: dict[int, dict[int, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for rec in read_rollouts(Path(run_dir) / ROLLOUT_DIR):
        if rec.get("held_out") or not isinstance(rec.get("step"), int):
            continue
        by_attempt[int(rec.get("attempt", 0))][rec["step"]].append(rec)
    out: dict[int, list[dict[str, Any]]] = {}
    for attempt in sorted(by_attempt):
        out.update(by_attempt[attempt])
    return out


def evaluation(metrics: Mapping[str, float], step: int) -> dict[str, Any] | None:
    """The held-out evaluation in verl's metrics of one step (None when the step did not validate)."""
    per_key: dict[str, dict[str, tuple[int, float]]] = defaultdict(dict)
    for name, value in metrics.items():
        match = _VAL.match(name)
        if not match or match["key"] not in EVAL_KEYS:
            continue
        n = int(match["n"])
        best = per_key[match["key"]].get(match["source"])
        if best is None or n > best[0]:  # mean@n over all n samples, not a subset's
            per_key[match["key"]][match["source"]] = (n, value)
    if not per_key:
        return None
    out: dict[str, Any] = {"step": step}
    for key, sources in per_key.items():
        out[EVAL_KEYS[key]] = sum(v for _, v in sources.values()) / len(sources)
        out["samples_per_problem"] = max(n for n, _ in sources.values())
    return out


def _rates(rollouts: list[dict[str, Any]]) -> dict[str, float]:
    n = len(rollouts)
    if not n:
        return {}
    out = {
        "rollout/format_valid": sum(bool(r.get("valid")) for r in rollouts) / n,
        "rollout/correct_and_valid": sum(bool(r.get("valid")) and bool(r.get("correct")) for r in rollouts) / n,
        "rollout/parallel_rate": sum(bool(r.get("parallel")) for r in rollouts) / n,
        "rollout/structurally_rejected": float(sum(r.get("rejected") is not None for r in rollouts)),
        "train/rollouts_generated": float(n),
    }
    if any("forked" in r for r in rollouts):
        out["rollout/engine_fork_rate"] = sum(bool(r.get("forked")) for r in rollouts) / n
    reasons: dict[str, int] = defaultdict(int)
    for r in rollouts:
        if r.get("rejected") is not None:
            reasons[str(r["rejected"])] += 1
    out.update({f"rollout/rejected/{k}": float(v) for k, v in reasons.items()})
    return out


def step_records(stage: str, run_dir: Path) -> list[dict[str, Any]]:
    """One record per step (and one for the evaluation before training, step 0, when verl ran it)."""
    metrics = verl_steps(run_dir)
    rollouts = rollouts_by_step(run_dir)
    records = []
    for step in sorted(set(metrics) | set(rollouts)):
        m = metrics.get(step, {})
        rec: dict[str, Any] = {"stage": stage, "step": step}
        rec.update({ours: m[theirs] for theirs, ours in TRAIN_KEYS.items() if theirs in m})
        rec.update(_rates(rollouts.get(step, [])))
        tokens = sum(int(r.get("tokens", 0)) for r in rollouts.get(step, []))
        if tokens and m.get("timing_s/gen"):
            rec["perf/tokens_per_s"] = tokens / m["timing_s/gen"]
        ev = evaluation(m, step)
        if ev is not None:
            rec["eval"] = ev
        rec.update({f"verl/{k}": v for k, v in m.items()})
        records.append(rec)
    return records


def write_step_log(records: Iterable[Mapping[str, Any]], path: Path) -> Path:
    """The records as the local trainer's ``metrics.jsonl`` (rewritten whole: it follows the merged log)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in records), encoding="utf-8")
    tmp.replace(path)
    return path


def summarize(records: list[Mapping[str, Any]], algorithm: str) -> dict[str, Any]:
    """The stage's metrics from its step records: the keys ``components.training.rl`` reports."""
    trained = [r for r in records if "reward/mean" in r]
    evals = [dict(r["eval"]) for r in records if isinstance(r.get("eval"), Mapping)]
    out: dict[str, Any] = {"steps": max((r["step"] for r in trained), default=0), "algorithm": algorithm}
    if evals:
        first, last = evals[0], evals[-1]
        for key in EVAL_KEYS.values():
            if key in last:
                out[f"final/{key}"] = last[key]
                if first["step"] == 0 and key in first:  # verl validated before training
                    out[f"initial/{key}"] = first[key]
                    out[f"delta/{key}"] = last[key] - first[key]
        if all("accuracy" in e for e in evals):
            out["min/accuracy"] = min(e["accuracy"] for e in evals)
        out["evals"] = evals
    if trained:
        generated = sum(r.get("train/rollouts_generated", 0.0) for r in trained)
        rejected = sum(r.get("rollout/structurally_rejected", 0.0) for r in trained)
        out["train/rollouts_generated"] = generated
        out["train/structurally_rejected"] = rejected
        speeds = [r["perf/tokens_per_s"] for r in trained if "perf/tokens_per_s" in r]
        if speeds:
            out["perf/tokens_per_s"] = sum(speeds) / len(speeds)
        out["reward/mean"] = sum(r["reward/mean"] for r in trained) / len(trained)
    return out


__all__ = [
    "ATTEMPT_ENV",
    "LOG_DIR_ENV",
    "FILE_LOGGER_ENV",
    "LOG_DIR",
    "ROLLOUT_DIR",
    "attempt_paths",
    "evaluation",
    "next_attempt",
    "rollouts_by_step",
    "step_records",
    "summarize",
    "verl_steps",
    "write_step_log",
]
