"""verl loads compute_score by path and calls it from threads; the CLI functions behind `npr grade`."""

from __future__ import annotations

import io
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from components.grading.cli_ops import answer_of, check_format_text, grade_jsonl, grade_pair
from components.grading.config import GradingConfig

REWARD_FILE = "components/grading/verl_reward.py"
VALID = (
    "<guideline><plan>1: rewrite the root</plan><plan>2: check by squaring</plan></guideline>"
    "<step>1: sqrt(8) = 2 sqrt(2) here</step><step>2: (2 sqrt 2)^2 = 8, fine</step>"
    "<takeaway>Both agree on the value.</takeaway>\nSo \\boxed{\\sqrt{8}}."
)
MALFORMED = "<step>1: oops</guideline> \\boxed{\\sqrt{8}}"
KEYS = {
    "score", "acc", "correct_and_valid", "parallel", "pred", "format_score", "valid", "filtered", "empty",
    "grade_failed", "truncated",
}


def _verl_reward_fn(reward_kwargs: dict[str, Any]) -> Any:
    """The function verl's trainer builds from `reward.custom_reward_function` (path, name, reward_kwargs)."""
    from omegaconf import OmegaConf
    from verl.trainer.ppo.reward import get_custom_reward_fn

    config = OmegaConf.create(
        {
            "reward": {
                "custom_reward_function": {
                    "path": REWARD_FILE,
                    "name": "compute_score",
                    "reward_kwargs": reward_kwargs,
                }
            }
        }
    )
    return get_custom_reward_fn(config)


@pytest.mark.slow  # importing verl's trainer takes ~20 s on the shared 2-core box
def test_verl_loads_and_calls_compute_score_from_threads(in_repo: Path, pool_cfg: GradingConfig) -> None:
    stage1 = _verl_reward_fn({})
    stage3 = _verl_reward_fn({"reward": "stage3"})
    calls = [
        # (fn, solution, ground truth as verl's parquet rows give it, extra_info)
        (stage1, VALID, "2\\sqrt{2}", {"id": "a"}),
        (stage1, VALID, np.array(["3", "2\\sqrt{2}"], dtype=object), {}),
        (stage1, VALID.replace("sqrt{8}}.", "sqrt{9}}."), "2\\sqrt{2}", None),
        (stage1, MALFORMED, "2\\sqrt{2}", {}),
        (stage1, "", "2\\sqrt{2}", {}),
        (stage1, VALID, "2\\sqrt{2}", {"reward_values": {"correct": 5.0}}),
        (stage3, MALFORMED, "2\\sqrt{2}", {}),
        (stage3, VALID, "2\\sqrt{2}", {}),
        (stage1, VALID, "2\\sqrt{2}", {"reward": "stage3", "reward_values": {"correct": 0.5}}),
    ]
    # verl's reward loop calls compute_score through `run_in_executor`, i.e. from worker threads.
    with ThreadPoolExecutor(max_workers=3) as threads:
        results = list(
            threads.map(
                lambda c: c[0](data_source="aime25", solution_str=c[1], ground_truth=c[2], extra_info=c[3]),
                calls,
            )
        )
    assert all(set(r) == KEYS for r in results) and not any(r["truncated"] for r in results)
    assert [r["score"] for r in results] == [1.0, 1.0, -1.0, -2.0, -2.0, 5.0, 0.0, 1.0, 0.5]
    assert [r["acc"] for r in results] == [1.0, 1.0, 0.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0]
    assert [r["filtered"] for r in results] == [False] * 6 + [True, False, False]
    assert results[0]["pred"] == "\\sqrt{8}" and results[4]["pred"] == ""
    assert results[0]["valid"] and not results[3]["valid"] and results[4]["empty"]


def test_compute_score_gives_nothing_for_a_truncated_rollout(in_repo: Path, pool_cfg: GradingConfig) -> None:
    from components.grading.verl_reward import compute_score

    # The box is complete, but the rollout producer says the response hit the length limit.
    cut = compute_score("x", VALID, "2\\sqrt{2}", {"finish_reason": "length"})
    assert cut["truncated"] and cut["acc"] == 0.0 and cut["score"] == -1.0 and cut["pred"] == ""
    unclosed = compute_score("x", VALID.replace("\\boxed{\\sqrt{8}}.", "\\boxed{\\sqrt{8"), "2\\sqrt{2}")
    assert unclosed["truncated"] and unclosed["acc"] == 0.0
    stopped = compute_score("x", VALID, "2\\sqrt{2}", None, finish_reason="stop")
    assert not stopped["truncated"] and stopped["acc"] == 1.0


def test_bad_reward_settings_fail_clearly(in_repo: Path) -> None:
    from components.grading.verl_reward import compute_score

    with pytest.raises(KeyError, match="unknown reward 'stage9'"):
        compute_score("x", "\\boxed{1}", "1", {"reward": "stage9"})
    with pytest.raises(ValueError, match="wrong"):
        compute_score("x", "\\boxed{1}", "1", {"reward_values": {"wrong": "minus one"}})


@pytest.mark.parametrize(
    ("pred", "answer"),
    [
        ("\\frac{1}{2}", "\\frac{1}{2}"),  # a bare answer is not cut to its last number
        ("so we get \\boxed{0.5}", "0.5"),
        ("Final Answer: 12", "12"),
        ("line one\nthe total is 7 apples", None),  # no explicit answer, and last_number is opt-in
        ("   ", None),
        ("it is \\boxed{12", None),  # truncated
    ],
)
def test_answer_of(pred: str, answer: str | None) -> None:
    assert answer_of(pred, GradingConfig()) == answer


def test_answer_of_with_last_number_opted_in_and_finish_reasons() -> None:
    cfg = GradingConfig.model_validate({"extraction": {"cli": {"fallbacks": ["answer_line", "last_number"]}}})
    assert answer_of("line one\nthe total is 7 apples", cfg) == "7"
    assert answer_of("so we get \\boxed{0.5}", GradingConfig(), "length") is None


def test_grade_pair(pool_cfg: GradingConfig) -> None:
    assert grade_pair("\\frac{1}{2}", "0.5", pool_cfg)
    assert grade_pair("after work \\boxed{\\sqrt{18}}", "3\\sqrt{2}", pool_cfg)
    assert not grade_pair("\\sqrt{17}", "3\\sqrt{2}", pool_cfg)


def test_grade_jsonl_keeps_order_and_survives_bad_lines(tmp_path: Path, pool_cfg: GradingConfig) -> None:
    lines = [
        json.dumps({"id": 1, "pred": "\\boxed{\\dfrac{1}{2}}", "gold": "0.5"}),
        "{not json",
        json.dumps({"id": 3, "pred": "\\sqrt{8}", "gold": "2\\sqrt{2}"}),
        "",
        json.dumps({"id": 4, "gold": "1"}),
        json.dumps([1, 2]),
        json.dumps({"id": 6, "pred": "4", "gold": None}),
        json.dumps({"id": 7, "pred": 4, "gold": "4"}),
        json.dumps({"id": 8, "pred": "26", "gold": 27.0}),
        json.dumps({"id": 9, "pred": "x", "gold": ["y", "x"]}),
    ]
    path = tmp_path / "pairs.jsonl"
    path.write_text("\n".join(lines) + "\n")
    out = io.StringIO()
    counts = grade_jsonl(path, out, pool_cfg)
    rows = [json.loads(line) for line in out.getvalue().splitlines()]
    assert counts == {"lines": 9, "graded": 4, "equal": 3, "errors": 5, "grade_failures": 0}
    assert [r.get("id") for r in rows] == [1, None, 3, 4, None, 6, 7, 8, 9]
    assert [r.get("equal") for r in rows] == [True, None, True, None, None, None, None, False, True]
    assert (
        rows[1] == {"line": 2, "raw": "{not json", "error": rows[1]["error"]}
        and "not JSON" in rows[1]["error"]
    )
    assert rows[3]["error"] == "missing field(s): pred"
    assert "not a JSON object" in rows[4]["error"]
    assert "holds no answer" in rows[5]["error"]
    assert "pred must be a string" in rows[6]["error"]


def test_npr_grade_and_check_format_commands(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pool_cfg: GradingConfig
) -> None:
    from typer.testing import CliRunner

    from components.cli import app

    monkeypatch.chdir(tmp_path)  # no params.yaml here: the commands use GradingConfig() defaults
    runner = CliRunner()
    assert runner.invoke(app, ["grade", "--pred", "\\frac{1}{2}", "--gold", "0.5"]).output.strip() == "true"
    assert runner.invoke(app, ["grade", "--pred", "0.4", "--gold", "0.5"]).output.strip() == "false"
    (tmp_path / "p.jsonl").write_text(json.dumps({"pred": "3", "gold": "x=3"}) + "\nbad\n")
    result = runner.invoke(app, ["grade", "--jsonl", str(tmp_path / "p.jsonl")])
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert rows[0]["equal"] is True and "error" in rows[1]
    assert result.exit_code == 1 and "errors 1" in result.stderr  # a row failed: non-zero, counts on stderr
    checked = runner.invoke(app, ["check-format", "-"], input=MALFORMED)
    report = json.loads(checked.output)
    assert report["valid"] is False and report == check_format_text(MALFORMED, "npr")


def test_check_format_text() -> None:
    assert check_format_text(VALID) == {"valid": True, "score": 0.0, "violations": []}
    report = check_format_text("no structure at all, \\boxed{1}")
    assert report["valid"] is False and report["score"] == -1.5
    assert report["violations"] == [
        {
            "code": "no_block",
            "position": report["violations"][0]["position"],
            "reason": report["violations"][0]["reason"],
        }
    ]
    with pytest.raises(ValueError):
        check_format_text(VALID, "no_such_schema")
