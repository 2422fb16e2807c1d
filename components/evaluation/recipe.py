"""The recipe comparison: every checkpoint of the run in the paper's order, and the paper's claims with intervals.

NPR (arXiv 2512.07461, Tables 2 and 3) claims, on Qwen3-4B: NPR beats the instruct model it starts from and
the sequential RL baseline SR, RL lifts NPR-Beta, NPR-Beta beats SR-Beta, NPR decodes (almost) always in
parallel, and parallel decoding is several times faster. ``recipe_summary`` measures each of those on one
benchmark (the held-out ``tiny_test`` on the tiny profile) from the per-sample evaluation records:

- accuracy differences as paired bootstrap intervals over problems (the same resampled problems on both
  sides: ``bounds.paired_bootstrap_difference``); each problem's score is its fraction of correct samples;
- the parallel rate and the ideal speedup of each checkpoint with bootstrap intervals over problems;
- the achieved speedup as measured by the evaluation's sequential re-decode of parallel checkpoints (``throughput``).

A claim "holds" when its point estimate is on the claimed side, and is "significant" when the whole
interval is. The result is a plain dict, so ``benchmarks/bench_recipe.py`` (from a finished run's records)
and the tests read the same numbers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from components.evaluation.bounds import bootstrap_ratio_interval, paired_bootstrap_difference
from components.evaluation.config import EvaluateConfig
from components.evaluation.metrics import group_by_problem


@dataclass(frozen=True)
class Claim:
    """``a - b`` is claimed to be ``>= 0`` (``ge``) or ``> 0`` (``gt``)."""

    a: str
    b: str
    relation: Literal["ge", "gt"]


@dataclass(frozen=True)
class Recipe:
    """The paper's comparison as the evaluate section states it (``recipe_names``, ``recipe_claims``,
    ``recipe_subject``): its checkpoints in its order with the paper's names, its accuracy claims, and the
    checkpoint its parallel-rate and speedup targets are about."""

    names: Mapping[str, str]
    claims: tuple[Claim, ...] = ()
    subject: str | None = None

    @classmethod
    def of(cls, ecfg: EvaluateConfig) -> Recipe:
        claims = tuple(Claim(c.a, c.b, c.relation) for c in ecfg.recipe_claims)
        return cls(dict(ecfg.recipe_names), claims, ecfg.recipe_subject)

    def paper_name(self, checkpoint: str) -> str:
        return self.names.get(checkpoint, checkpoint)

    def claim_text(self, claim: Claim) -> str:
        sign = "≥" if claim.relation == "ge" else ">"
        return f"{self.paper_name(claim.a)} {sign} {self.paper_name(claim.b)}"

    def order(self, checkpoints: Iterable[str]) -> list[str]:
        """``checkpoints`` in the paper's order, then the others in their own order."""
        given = list(dict.fromkeys(checkpoints))
        known = [n for n in self.names if n in given]
        return known + [n for n in given if n not in known]


# Targets on the subject checkpoint, NPR (issue #17's "Done when").
PARALLEL_RATE_TARGET = 0.95
IDEAL_SPEEDUP_TARGET = 2.0
EFFICIENCY_TARGET = 0.85


def _per_problem(records: Sequence[Mapping[str, Any]], field: str) -> dict[str, float]:
    """Each problem's mean of a 0/1 field, keyed by problem id."""
    groups = group_by_problem(records, field)
    ids = list(dict.fromkeys(str(r["problem_id"]) for r in records))
    return {pid: sum(bool(v) for v in g) / len(g) for pid, g in zip(ids, groups, strict=True)}


def _interval(
    values: Sequence[float], confidence: float, n_resamples: int, seed: int
) -> tuple[float, float, float]:
    """Mean of per-problem values with its two-sided bootstrap interval (a difference against zero)."""
    zeros = [0.0] * len(values)
    return paired_bootstrap_difference(values, zeros, confidence, n_resamples, seed)


def checkpoint_row(
    name: str,
    records: Sequence[Mapping[str, Any]],
    ckpt_metrics: Mapping[str, Any],
    confidence: float,
    n_resamples: int,
    seed: int,
    paper_name: str | None = None,
) -> dict[str, Any]:
    """One row of the recipe table: accuracy, pass@k, format-valid and parallel rates (with intervals), the
    ideal speedup of its traces and, for parallel checkpoints, the measured speedup."""
    bench = ckpt_metrics["benchmarks"][records[0]["benchmark"]]
    acc = _interval(list(_per_problem(records, "correct").values()), confidence, n_resamples, seed)
    par = _interval(list(_per_problem(records, "is_parallel").values()), confidence, n_resamples, seed)
    totals = [float(r["n_tokens"]) for r in records]
    crits = [float(r["critical_path_tokens"]) for r in records]
    ideal = (
        bootstrap_ratio_interval(totals, crits, confidence, n_resamples, seed)
        if sum(crits) > 0
        else (1.0,) * 3
    )
    # the evaluation's speedup decode: achieved and ideal speedup of the checkpoint's traces
    speed = dict(ckpt_metrics.get("speedup") or ckpt_metrics.get("throughput") or {})
    if speed.get("efficiency") is None and speed.get("achieved_speedup") and speed.get("ideal_speedup"):
        speed["efficiency"] = speed["achieved_speedup"] / speed["ideal_speedup"]
    return {
        "checkpoint": name,
        "paper_name": paper_name or name,
        "mode": ckpt_metrics["mode"],
        "n_problems": bench["n_problems"],
        "n_samples": bench["n_samples"],
        "k": bench["k"],
        "accuracy": acc,
        "pass@k": bench["pass@k"],
        "format_valid_rate": bench["format_valid_rate"],
        "parallel_rate": par,
        "ideal_speedup": ideal,
        "achieved_speedup": speed.get("achieved_speedup"),
        "measured_ideal_speedup": speed.get("ideal_speedup"),
        "speedup_efficiency": speed.get("efficiency"),
    }


def recipe_summary(
    eval_metrics: Mapping[str, Any],
    records: Mapping[str, Mapping[str, Sequence[Mapping[str, Any]]]],
    benchmark: str,
    recipe: Recipe,
    confidence: float = 0.95,
    n_resamples: int = 2000,
    seed: int = 0,
) -> dict[str, Any]:
    """Rows (the run's checkpoints in the paper's order), claims with paired intervals, and the targets.

    ``records[checkpoint][benchmark]`` are the per-sample records of the evaluation decode. Claims whose
    checkpoints are not both in the run are left out. Raises ValueError when the two sides of a claim were
    measured on different problems (a paired difference needs the same ones).
    """
    present = recipe.order(n for n in eval_metrics["checkpoints"] if benchmark in records.get(n, {}))
    rows = [
        checkpoint_row(
            n,
            records[n][benchmark],
            eval_metrics["checkpoints"][n],
            confidence,
            n_resamples,
            seed,
            recipe.paper_name(n),
        )
        for n in present
    ]
    claims = []
    for claim in recipe.claims:
        if claim.a not in present or claim.b not in present:
            continue
        a = _per_problem(records[claim.a][benchmark], "correct")
        b = _per_problem(records[claim.b][benchmark], "correct")
        if set(a) != set(b):
            raise ValueError(f"{recipe.claim_text(claim)}: the two checkpoints were evaluated on different problems")
        ids = sorted(a)
        diff, lo, hi = paired_bootstrap_difference(
            [a[i] for i in ids], [b[i] for i in ids], confidence, n_resamples, seed
        )
        holds = diff >= 0 if claim.relation == "ge" else diff > 0
        claims.append(
            {
                "claim": recipe.claim_text(claim),
                "a": claim.a,
                "b": claim.b,
                "relation": claim.relation,
                "difference": diff,
                "interval": [lo, hi],
                "holds": bool(holds),
                "significant": bool(lo > 0),
            }
        )
    targets = []
    subject = next((r for r in rows if r["checkpoint"] == recipe.subject), None)
    if subject is not None:
        name = subject["paper_name"]
        targets.append(_target(f"{name} parallel rate", subject["parallel_rate"], PARALLEL_RATE_TARGET))
        targets.append(_target(f"{name} ideal speedup", subject["ideal_speedup"], IDEAL_SPEEDUP_TARGET))
        if subject["speedup_efficiency"] is not None:
            eff = subject["speedup_efficiency"]
            targets.append(_target(f"{name} achieved / ideal speedup", (eff, None, None), EFFICIENCY_TARGET))
    return {
        "benchmark": benchmark,
        "confidence": confidence,
        "n_resamples": n_resamples,
        "seed": seed,
        "rows": rows,
        "claims": claims,
        "targets": targets,
    }


def _target(name: str, value: Sequence[float | None], target: float) -> dict[str, Any]:
    point, lo, hi = value
    assert point is not None
    return {
        "target": f"{name} ≥ {target:g}",
        "value": point,
        "interval": [lo, hi] if lo is not None else None,
        "holds": bool(point >= target),
    }


# ---------------------------------------------------------------------------------------------- rendering
def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.1f}"


def _pct_ci(v: Sequence[float]) -> str:
    return f"{100 * v[0]:.1f} [{100 * v[1]:.1f}, {100 * v[2]:.1f}]"


def _num(x: float | None, digits: int = 2) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def _spread_cell(spread: Mapping[str, Any], checkpoint: str) -> str:
    """A checkpoint's committed avg@n over the seeds: ``mean (spread)`` in %, or – when not measured."""
    acc = ((spread["checkpoints"].get(checkpoint) or {}).get("metrics") or {}).get("accuracy") or {}
    if acc.get("mean") is None:
        return "–"
    return f"{100 * acc['mean']:.1f} ({100 * acc['spread']:.1f})"


def seed_spread_note(committed: Mapping[str, Any], n: int | str) -> str:
    """What the committed seed spread (``spread.committed_spread``) says about this table."""
    where = committed.get("file")
    if committed["state"] == "shown":
        runs = len(committed["spread"]["runs"])
        return (
            f"Seed spread (`{where}`): the avg@{n} column beside each checkpoint's is the mean (and spread, "
            f"max - min) over {runs} runs of this recipe that differ only in their training seeds (same "
            "problems, evaluation sampling fixed). A difference between two checkpoints, or between this run "
            "and another run of the same recipe, smaller than the spread is inside training noise."
        )
    why = {
        "unset": "`evaluate.seed_spread` is null",
        "absent": f"`{where}` does not exist",
        "mismatch": f"`{where}` does not match this run: {committed.get('detail', '')}",
    }[committed["state"]]
    return (
        f"No seed spread is committed ({why}): how far retraining with other seeds moves these numbers is not "
        "known here, so a difference between two runs may be training noise "
        "(`benchmarks/bench_recipe.py --seeds N --json PATH` measures it)."
    )


def recipe_markdown(summary: Mapping[str, Any]) -> str:
    """The recipe table, the claims table and the targets table as markdown; with the committed seed spread
    (``summary["seed_spread"]``, the evaluate stage's) a column of its avg@n and a sentence on it."""
    conf = f"{100 * summary['confidence']:.0f}%"
    bench = summary["benchmark"]
    k = summary["rows"][0]["k"] if summary["rows"] else "k"
    n = summary["rows"][0]["n_samples"] if summary["rows"] else "n"
    committed = summary.get("seed_spread")
    spread = committed["spread"] if committed and committed["state"] == "shown" else None
    spread_header = f" avg@{n}, {len(spread['runs'])} seeds: mean (spread) |" if spread else ""
    lines = [
        f"On `{bench}` ({summary['rows'][0]['n_problems'] if summary['rows'] else 0} problems x {n} samples); "
        f"[{conf} bootstrap interval over problems, {summary['n_resamples']} resamples].",
        "",
        f"| checkpoint | stage | mode | avg@{n} |{spread_header} pass@{k} | format-valid | parallel rate "
        "| ideal speedup | achieved speedup | achieved / ideal |",
        "|---|---|---|---|" + ("---|" if spread else "") + "---|---|---|---|---|---|",
    ]
    for r in summary["rows"]:
        spread_cell = f" {_spread_cell(spread, r['checkpoint'])} |" if spread else ""
        lines.append(
            f"| {r['paper_name']} | {r['checkpoint']} | {r['mode']} | {_pct_ci(r['accuracy'])} |{spread_cell} "
            f"{_pct(r['pass@k'])} | {_pct(r['format_valid_rate'])} | {_pct_ci(r['parallel_rate'])} | "
            f"{_num(r['ideal_speedup'][0])} [{_num(r['ideal_speedup'][1])}, {_num(r['ideal_speedup'][2])}] | "
            f"{_num(r['achieved_speedup'])} | {_num(r['speedup_efficiency'])} |"
        )
    if committed:
        lines += ["", seed_spread_note(committed, n)]
    lines += [
        "",
        f"| claim (paper) | difference, points [{conf}] | holds | significant (interval on the claimed side) |",
        "|---|---|---|---|",
    ]
    for c in summary["claims"]:
        lo, hi = c["interval"]
        lines.append(
            f"| {c['claim']} | {100 * c['difference']:+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}] | "
            f"{'yes' if c['holds'] else 'no'} | {'yes' if c['significant'] else 'no'} |"
        )
    if summary["targets"]:
        lines += ["", "| target | value | holds |", "|---|---|---|"]
        for t in summary["targets"]:
            value = f"{t['value']:.3f}"
            if t["interval"]:
                value += f" [{t['interval'][0]:.3f}, {t['interval'][1]:.3f}]"
            lines.append(f"| {t['target']} | {value} | {'yes' if t['holds'] else 'no'} |")
    return "\n".join(lines)
