"""The Parallel-R1 data layer: rendered cold-start trajectories, local cold-start and RL problem files, the gate.

One gate for both profiles: the ``sample_orz`` quality suite on the problems, then a well-formed trace of the
``parallel_r1`` schema whose final answer is the gold one. Every row that does not pass is kept with its
reasons and the counts reconcile.
"""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

import pandas as pd
import pytest

from components.data import synthetic
from components.data.pr1_coldstart import (
    check_coldstart,
    load_rows,
    render_trajectory,
    synthetic_rows,
    write_coldstart_audit,
)
from components.data.pr1_problems import training_problems
from components.data.quality import DataQualityError, QualityRules
from components.grading.config import GradingConfig
from components.grading.judge import judge
from components.structure import parse_text, trace_metrics
from components.training.config import ProblemSourceConfig

RULES = QualityRules(min_problem_chars=5, max_problem_chars=2000, max_answer_chars=64, min_kept_fraction=0.0)
GOOD = (
    "<Parallel><Path>Natalia sold 48 and then 24</Path><Path>48 / 2 = 24, 48 + 24</Path></Parallel>"
    "<Summary>both paths give 72</Summary>\nFinal Answer: 72"
)


@pytest.mark.parametrize("difficulty", synthetic.DIFFICULTIES)
def test_rendered_trajectories_are_valid_correct_and_parallel(difficulty: str) -> None:
    rng = random.Random(0)
    for record in synthetic.generate_problems(30, seed=1, weights={difficulty: 1.0}):
        for paths in (2, 3):
            text = render_trajectory(record, paths, rng)
            j = judge(text, record["answer"], "parallel_r1", purpose="distill")
            assert j.valid and j.correct, (text, j.violations)
            metrics = trace_metrics(parse_text(text, "parallel_r1"))
            assert metrics.is_parallel and metrics.branches == (paths,)
    with pytest.raises(ValueError, match="at least 2 paths"):
        render_trajectory(record, 1, rng)


def test_paths_are_whole_attempts_named_as_the_seed_names_brackets() -> None:
    """Each path solves the whole problem on its own, bracket by bracket in order, each named ``Bracket i:``
    (the seed's sequential phrasing) and ending in its named value; the paths of a block differ only when
    sampled (they are decoded from the same context), so the rendered ones are identical."""
    record = next(
        r for r in synthetic.generate_problems(20, seed=3) if len(synthetic.expression_of(r).parts) >= 3
    )
    expr = synthetic.expression_of(record)
    text = render_trajectory(record, 2, random.Random(0))
    paths = [p.split("</Path>")[0] for p in text.split("<Path>")[1:]]
    assert len(paths) == 2 and paths[0] == paths[1]
    starts = [paths[0].index(f"Bracket {i}: {expr.step_text(i)}.") for i in range(1, len(expr.parts) + 1)]
    assert starts == sorted(starts) and starts[0] == 0
    assert paths[0].endswith(f"So {expr.takeaway}")


def test_synthetic_rows_take_the_configured_difficulties() -> None:
    problems = synthetic.generate_problems(200, seed=4, weights={"easy": 0.5, "medium": 0.25, "hard": 0.25})
    rows = synthetic_rows(problems, ["easy"], n=40, paths=2, seed=0)
    assert len(rows) == 40 and {r["difficulty"] for r in rows} == {"easy"}
    assert rows == synthetic_rows(problems, ["easy"], n=40, paths=2, seed=0)  # deterministic
    assert {r["id"] for r in rows} <= {p["id"] for p in problems}
    assert all(r["source"] == "pr1_coldstart" and r["response"].startswith("<Parallel>") for r in rows)
    with pytest.raises(ValueError, match="no problem of difficulty"):
        synthetic_rows([p for p in problems if p["difficulty"] != "hard"], ["hard"], None, 2, 0)


def test_local_gsm8k_style_files_are_read_and_gated(tmp_path: Path) -> None:
    data = tmp_path / "coldstart"
    data.mkdir()
    natalia = "Natalia sold clips to 48 of her friends in April, and then half as many in May. How many?"
    lines = [
        {"question": natalia, "answer": "In May she sold 48/2 = 24.\n#### 72", "response": GOOD},
        {
            "question": "A train goes 60 km in 1 hour. How far in 3 hours?",
            "answer": "#### 180",
            "response": GOOD.replace("72", "170"),
        },  # a wrong final answer
        {
            "question": "What is 6 times 7, the famous answer?",
            "answer": "42",
            "response": "6 * 7 = 42.\nFinal Answer: 42",
        },  # no block
        {"question": "What is two plus two, in words?", "answer": "4"},  # no trajectory
        {"question": "", "answer": "1", "response": GOOD},  # empty problem (the problem suite)
        {"question": natalia, "answer": "72", "response": GOOD},  # a duplicate
    ]
    (data / "part-0.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    (data / "part-1.json").write_text(
        json.dumps(
            [
                {
                    "problem": "Compute 1,000 + 234 as a number.",
                    "answer": 1234,
                    "trajectory": GOOD.replace("72", "1234"),
                }
            ]
        )
    )
    rows, infos = load_rows(data)
    assert [i["items"] for i in infos] == [6, 1] and len(rows) == 7
    assert rows[0]["answer"] == "72" and rows[1]["answer"] == "180" and rows[6]["answer"] == "1234"
    assert rows[0]["origin"] == "part-0.jsonl#0"
    report = check_coldstart(rows, RULES, GradingConfig())
    rec = report.reconciliation()
    assert rec["balanced"] and rec["rows_in"] == 7
    assert [r["answer"] for r in report.kept] == ["72", "1234"]
    assert rec["quarantined"] == 1 and rec["duplicates"] == 1 and rec["trajectory_rejected"] == 3
    assert rec["trajectory_reasons"] == {
        "response_format:no_block": 1,
        "response_missing": 1,
        "response_wrong_answer": 1,
    }
    audit = tmp_path / "audit"
    written = write_coldstart_audit(report, audit)
    assert written["kept"] == 2
    assert len((audit / "trajectory_rejected.jsonl").read_text().splitlines()) == 3
    assert (audit / "quarantine.jsonl").exists() and (audit / "gx_docs" / "index.html").exists()
    report.raise_for_floor()  # no floor in RULES
    with pytest.raises(DataQualityError, match="cold-start rows"):  # 2 of 7 kept is below a floor of 0.5
        dataclasses.replace(report, min_kept_fraction=0.5).raise_for_floor()


def test_missing_or_unreadable_cold_start_data_fails_with_its_path(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_rows(tmp_path / "nowhere")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "x"}\nnot json\n')
    with pytest.raises(ValueError, match="bad.jsonl:2"):
        load_rows(bad)


def test_rl_problems_from_sample_orz_are_the_hard_ones(tmp_path: Path) -> None:
    from components.artifacts import write_shards

    problems = synthetic.generate_problems(120, seed=5, weights={"easy": 0.5, "medium": 0.25, "hard": 0.25})
    out = tmp_path / "problems"
    write_shards(out, [{**p, "split": "train"} for p in problems], 1, stem="train")
    src = ProblemSourceConfig(difficulties=["medium", "hard"], n=20)
    rows, provenance, report = training_problems(src, out)
    assert report is None and len(rows) == 20 and {r["difficulty"] for r in rows} <= {"medium", "hard"}
    assert provenance["available"] == 60
    assert rows == training_problems(src, out)[0]


def test_rl_problems_from_dapo_style_files_pass_the_quality_gate(tmp_path: Path) -> None:
    data = tmp_path / "dapo"
    data.mkdir()
    frame = pd.DataFrame(
        [
            {
                "prompt": [{"role": "user", "content": "Find the sum of all integers from 1 to 10."}],
                "reward_model": {"ground_truth": "55", "style": "rule"},
            },
            {
                "prompt": [{"role": "user", "content": "How many primes are below twenty?"}],
                "reward_model": {"ground_truth": "8", "style": "rule"},
            },
            {
                "prompt": [{"role": "user", "content": ""}],
                "reward_model": {"ground_truth": "1", "style": "rule"},
            },
        ]
    )
    frame.to_parquet(data / "train.parquet")
    src = ProblemSourceConfig(source="local", local_path=str(data), min_kept_fraction=0.5)
    rows, provenance, report = training_problems(src, None)
    assert sorted(r["answer"] for r in rows) == ["55", "8"] and provenance["rows_in"] == 3
    assert report is not None and report.reconciliation()["quarantined"] == 1
    with pytest.raises(DataQualityError):  # the gate's floor: 2 of 3 kept is below 0.9
        dataclasses.replace(
            report, rules=dataclasses.replace(report.rules, min_kept_fraction=0.9)
        ).raise_for_floor()
