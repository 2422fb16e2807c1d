"""reject_filter on crafted trajectories: buckets, reasons, reconciliation, the GX gate, the outputs."""

from __future__ import annotations

from pathlib import Path

import pytest

from components.artifacts import read_json, read_shards, write_shards
from components.config import load_config
from components.dag import StageIO
from components.data.acceptance import filter_trajectories
from components.data.config import RejectFilterConfig
from components.stages import reject_filter
from components.stages.reject_filter import QualityGateError

GOOD = "<guideline><plan>1: add</plan></guideline><step>1: 2+3=5</step><takeaway>so 5</takeaway> \\boxed{5}"


def _rec(pid: str, idx: int, **over) -> dict:
    rec = {
        "problem_id": pid,
        "sample_idx": idx,
        "problem": "2+3",
        "answer": "5",
        "difficulty": "easy",
        "prompt": "p",
        "response": f"{GOOD} #{idx}",
        "n_tokens": 20,
        "answer_pred": "5",
        "correct": True,
        "format_score": 0.0,
        "valid": True,
        "finish_reason": "stop",
        "structure": {"parallel_taken": False},
    }
    rec.update(over)
    return rec


CFG = RejectFilterConfig(max_accepted_per_problem=2, min_response_tokens=4, max_response_tokens=64)


def _crafted() -> list[dict]:
    recs = [
        _rec("a", 0),
        _rec("a", 1, correct=False),  # wrong
        _rec("a", 2, valid=False, format_score=-1.0),  # format
        _rec("a", 3, correct=False, valid=False),  # wrong first
        _rec("a", 4),  # second accepted (cap 2)
        _rec("a", 5),  # over cap
        _rec("b", 0),
        _rec("b", 1, response=_rec("b", 0)["response"]),  # duplicate text
        _rec("b", 2, n_tokens=2),  # too short
        _rec("b", 3, n_tokens=65),  # too long
        _rec("b", 4, finish_reason="length"),  # truncated
        _rec("b", 5, response="   "),  # empty
        {"problem_id": "c", "sample_idx": 0},  # bad record
        _rec("c", 1, n_tokens="20"),  # bad type
    ]
    return recs


def test_every_trajectory_lands_in_one_bucket_and_counts_reconcile() -> None:
    accepted, quarantined, counts = filter_trajectories(_crafted(), CFG)
    assert counts == {
        "sampled": 14,
        "accepted": 3,
        "rejected_wrong": 2,
        "rejected_format": 1,
        "rejected_other": 8,
    }
    assert [(r["problem_id"], r["sample_idx"]) for r in accepted] == [("a", 0), ("a", 4), ("b", 0)]
    reasons = {(q["problem_id"], q["sample_idx"]): q["reject_reasons"] for q in quarantined}
    assert reasons[("a", 3)] == ["wrong", "format"]
    assert reasons[("a", 5)] == ["over_cap"]
    assert reasons[("b", 1)] == ["duplicate"]
    assert reasons[("b", 2)] == ["too_short"] and reasons[("b", 3)] == ["too_long"]
    assert reasons[("b", 4)] == ["truncated"] and "empty" in reasons[("b", 5)]
    assert "missing:response" in reasons[("c", 0)] and reasons[("c", 1)] == ["type:n_tokens"]


def _io(tmp_path: Path) -> StageIO:
    return StageIO(
        stage="reject_filter",
        inputs={"distill/trajectories": tmp_path / "distill" / "trajectories"},
        outputs={"accepted": tmp_path / "rf" / "accepted", "audit": tmp_path / "rf" / "audit"},
    )


def test_stage_writes_accepted_quarantine_and_gx_report(tmp_path: Path) -> None:
    cfg = load_config(profile="tiny")
    cfg.reject_filter = CFG
    io = _io(tmp_path)
    write_shards(io.input("distill/trajectories"), _crafted(), n_shards=2)
    metrics = reject_filter.run(cfg, io)
    assert metrics["accepted"] == 3 and metrics["gx_success"]
    assert metrics["acceptance_rate_by_difficulty"] == {"None": 0.0, "easy": pytest.approx(2 / 3)}
    assert [r["response"] for r in read_shards(io.output("accepted"))] == [
        r["response"] for r in filter_trajectories(_crafted(), CFG)[0]
    ]
    assert len(read_shards(io.output("audit"), stem="quarantine")) == 11
    assert read_json(io.output("audit") / "reconciliation.json")["rejected_other"] == 8
    assert read_json(io.output("audit") / "gx_report.json")["success"]


def test_gate_fails_when_a_difficulty_is_under_the_acceptance_floor(tmp_path: Path) -> None:
    cfg = load_config(profile="tiny")
    cfg.reject_filter = RejectFilterConfig(
        min_response_tokens=4, max_response_tokens=64, min_acceptance_rate=0.5
    )
    io = _io(tmp_path)
    recs = [_rec("a", 0), _rec("h", 0, difficulty="hard", correct=False), _rec("h2", 0, difficulty="hard")]
    recs += [_rec("h3", 0, difficulty="hard", correct=False)]
    write_shards(io.input("distill/trajectories"), recs, n_shards=1)
    with pytest.raises(QualityGateError, match="acceptance_rate_per_difficulty"):
        reject_filter.run(cfg, io)
    # The audit is still written (nothing is lost) and no accepted set is published.
    assert read_json(io.output("audit") / "gx_report.json")["acceptance_rate_by_difficulty"][
        "hard"
    ] == pytest.approx(1 / 3)
    assert not io.output("accepted").exists()


def test_accepted_problem_prefix_is_the_shortest_prefix_reaching_the_target() -> None:
    """distill's stopping rule is reject_filter's rule: a problem counts once it has an accepted trajectory
    (wrong, invalid, duplicate or too-short samples do not count)."""
    from components.data.acceptance import accepted_problem_prefix

    recs = [
        _rec("a", 0, correct=False),
        _rec("b", 0, valid=False, format_score=-1.0),
        _rec("c", 0, n_tokens=2),  # too short
        _rec("c", 1),  # accepted: c is the first problem with one
        _rec("d", 0, finish_reason="length"),
        _rec("e", 0),
    ]
    order = ["a", "b", "c", "d", "e"]
    assert accepted_problem_prefix(order, recs, CFG, 1) == (3, 1)
    assert accepted_problem_prefix(order, recs, CFG, 2) == (5, 2)
    assert accepted_problem_prefix(order, recs, CFG, 3) == (5, 2)  # short: the whole list
