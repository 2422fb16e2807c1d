"""Gate decisions on canned results: clear pass, noise-level drop, real drop, format collapse, drift."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from components.evaluation.gate import (
    GateRefused,
    gate_checkpoint,
    load_baseline,
    load_last_green,
    render_gate_markdown,
    save_last_green,
    write_baseline,
)
from components.evaluation.metrics import RECORD_FIELDS
from tests.unit.evaluation.conftest import SETTINGS


def _gate(current_eval: dict, cfg: Any, **kw: Any):
    return gate_checkpoint(
        current_eval["checkpoints"]["papo_rl"], current_eval["settings"], kw.pop("baseline"), cfg, **kw
    )


@pytest.fixture()
def baseline(tmp_path: Path, make_eval: Any, tiny_cfg: Any) -> Any:
    return write_baseline(make_eval(0.60), tiny_cfg, tmp_path / "tiny-papo_rl.yaml", command="pytest")


def _verdicts(result: Any, reference: str) -> dict[tuple[str, str], str]:
    return {(c.benchmark, c.metric): c.verdict for c in result.checks if c.reference == reference}


def test_baseline_file_round_trips_with_provenance(tmp_path: Path, baseline: Any) -> None:
    path = tmp_path / "tiny-papo_rl.yaml"
    text = path.read_text()
    assert text.startswith("# Baseline of checkpoint 'papo_rl' (profile 'tiny')")
    assert "# Produced by: pytest" in text
    loaded = load_baseline(path)
    assert loaded == baseline
    assert loaded.tag == "tiny-papo_rl" and loaded.prompt_hash == "abc123"
    assert loaded.sampling["max_new_tokens"] == 96
    b = loaded.benchmarks["tiny_test"]
    assert (b.n_problems, b.n_samples, b.k) == (200, 4, 4)
    assert b.metrics["accuracy"] == 0.60 and b.metrics["parallel_rate"] == 0.95


def test_write_baseline_names_a_missing_checkpoint(tmp_path: Path, make_eval: Any, tiny_cfg: Any) -> None:
    with pytest.raises(KeyError, match="sr_rl"):
        write_baseline(make_eval(), tiny_cfg, tmp_path / "x.yaml", checkpoint="sr_rl")
    with pytest.raises(FileNotFoundError, match="write_baseline"):
        load_baseline(tmp_path / "missing.yaml")


def test_clear_pass(baseline: Any, make_eval: Any, nightly_cfg: Any) -> None:
    result = _gate(make_eval(0.62), nightly_cfg, baseline=baseline)
    assert result.verdict == "pass"
    assert _verdicts(result, "baseline") == {
        ("tiny_test", "accuracy"): "pass",
        ("tiny_test", "pass@k"): "pass",
    }


def test_noise_level_drop_passes_or_warns_never_fails(
    baseline: Any, make_eval: Any, nightly_cfg: Any
) -> None:
    # Within tolerance (0.60 * 0.95 = 0.57): pass.
    assert _gate(make_eval(0.58), nightly_cfg, baseline=baseline).verdict == "pass"
    # Below the threshold on the point estimate, but the Wilson upper bound at n=800 (~0.588) is above it.
    result = _gate(make_eval(0.56, **{"pass@k": 0.8}), nightly_cfg, baseline=baseline)
    assert result.verdict == "warn"
    acc = next(c for c in result.checks if c.metric == "accuracy" and c.reference == "baseline")
    assert acc.verdict == "warn" and acc.bound == pytest.approx(0.5884, abs=1e-3)


def test_real_drop_fails(baseline: Any, make_eval: Any, nightly_cfg: Any) -> None:
    result = _gate(make_eval(0.45), nightly_cfg, baseline=baseline)
    assert result.verdict == "fail"
    acc = next(c for c in result.failures() if c.metric == "accuracy")
    assert acc.bound < acc.threshold == pytest.approx(0.57)


def test_same_drop_on_few_problems_is_only_a_warning(tmp_path: Path, make_eval: Any, tiny_cfg: Any) -> None:
    # 10 problems x 1 sample: 0.6 -> 0.4 is within the noise of so few samples.
    small = {"n_problems": 10, "n_samples": 1, "k": 1}
    base = write_baseline(make_eval(0.6, **small), tiny_cfg, tmp_path / "b.yaml")
    cfg = tiny_cfg.nightly.model_copy(update={"format_valid_floor": 0.5, "parallel_rate_floor": 0.5})
    result = _gate(make_eval(0.4, **small, **{"pass@k": 0.8}), cfg, baseline=base)
    assert _verdicts(result, "baseline")[("tiny_test", "accuracy")] == "warn"


def test_format_collapse_fails_even_when_accuracy_holds(
    baseline: Any, make_eval: Any, nightly_cfg: Any
) -> None:
    result = _gate(make_eval(0.61, format_valid_rate=0.30), nightly_cfg, baseline=baseline)
    assert result.verdict == "fail"
    assert [(c.metric, c.reference) for c in result.failures()] == [("format_valid_rate", "floor")]


def test_parallel_rate_floor_applies_to_parallel_checkpoints_only(
    tmp_path: Path, baseline: Any, make_eval: Any, tiny_cfg: Any, nightly_cfg: Any
) -> None:
    collapsed = _gate(make_eval(0.61, parallel_rate=0.10), nightly_cfg, baseline=baseline)
    assert [c.metric for c in collapsed.failures()] == ["parallel_rate"]
    seq_base = write_baseline(
        make_eval(0.6, mode="sequential", parallel_rate=0.0), tiny_cfg, tmp_path / "s.yaml"
    )
    seq = _gate(make_eval(0.61, mode="sequential", parallel_rate=0.0), nightly_cfg, baseline=seq_base)
    assert seq.verdict == "pass"
    assert all(c.metric != "parallel_rate" for c in seq.checks)


def test_format_drop_above_floor_warns(baseline: Any, make_eval: Any, nightly_cfg: Any) -> None:
    result = _gate(make_eval(0.61, format_valid_rate=0.85), nightly_cfg, baseline=baseline)
    assert result.verdict == "warn"
    assert [c.metric for c in result.warnings()] == ["format_valid_rate"]


def test_other_settings_are_refused_never_a_regression(
    baseline: Any, make_eval: Any, nightly_cfg: Any
) -> None:
    cases = {
        "prompt_hash": make_eval(0.6, settings={"prompt_hash": "other"}),
        "prompt_style": make_eval(0.6, prompt_style="sequential"),
        "tiny_test.n_problems": make_eval(0.6, n_problems=100),
        "tiny_test.k": make_eval(0.6, k=2),
        "sampling.merge_mode": make_eval(
            0.6, settings={"sampling": {**SETTINGS["sampling"], "merge_mode": "reprefill"}}
        ),
        "sampling.merge_semantics isolated in the baseline, reread now": make_eval(
            0.6, settings={"sampling": {**SETTINGS["sampling"], "merge_semantics": "reread"}}
        ),
        "grader_version": make_eval(0.6, settings={"grader_version": {"math-verify": "9", "settings": "x"}}),
        "mode": make_eval(0.6, mode="sequential"),
    }
    for what, ev in cases.items():
        with pytest.raises(GateRefused) as err:
            _gate(ev, nightly_cfg, baseline=baseline)
        message = str(err.value)
        assert what in message and "not a regression" in message, (what, message)
        assert "npr nightly promote artifacts/papo_rl/model" in message
    engine = {"npr_pipeline": "0.2.0", "torch": "2.13.0", "transformers": "5.10.4", "backend": "torch"}
    bumped = _gate(make_eval(0.6, settings={"engine_version": engine}), nightly_cfg, baseline=baseline)
    assert bumped.verdict == "warn" and [c.metric for c in bumped.warnings()] == ["engine_version"]


def test_drift_vs_last_green_warns_but_never_fails(
    tmp_path: Path, baseline: Any, make_eval: Any, nightly_cfg: Any
) -> None:
    green = make_eval(0.80)
    state = tmp_path / "state" / "last_green.json"
    save_last_green(state, green["checkpoints"]["papo_rl"], green["settings"], "pass")
    last_green = load_last_green(state)
    result = _gate(make_eval(0.62), nightly_cfg, baseline=baseline, last_green=last_green)
    assert _verdicts(result, "baseline")[("tiny_test", "accuracy")] == "pass"
    assert _verdicts(result, "last_green")[("tiny_test", "accuracy")] == "warn"
    assert result.verdict == "warn"
    with pytest.raises(ValueError):
        save_last_green(state, green["checkpoints"]["papo_rl"], green["settings"], "fail")
    assert load_last_green(tmp_path / "none.json") is None


def _records(accuracy_by_problem: list[float], n_samples: int) -> list[dict]:
    recs = []
    for p, acc in enumerate(accuracy_by_problem):
        n_correct = round(acc * n_samples)
        for i in range(n_samples):
            rec = dict.fromkeys(RECORD_FIELDS)
            rec.update(problem_id=f"p{p}", sample_idx=i, correct=i < n_correct)
            recs.append(rec)
    return recs


def test_bootstrap_method_resamples_problems(tmp_path: Path, make_eval: Any, tiny_cfg: Any) -> None:
    cfg = tiny_cfg.nightly.model_copy(update={"method": "bootstrap", "bootstrap_samples": 500})
    base = write_baseline(make_eval(0.6), tiny_cfg, tmp_path / "b.yaml")
    rng = random.Random(0)
    # 200 problems, all-or-nothing: the samples of a problem agree, so the effective n is 200, not 800.
    clustered = [1.0 if rng.random() < 0.55 else 0.0 for _ in range(200)]
    acc = sum(clustered) / 200
    current = make_eval(acc, **{"pass@k": acc})
    result = _gate(current, cfg, baseline=base, records={"tiny_test": _records(clustered, 4)})
    check = next(c for c in result.checks if c.metric == "accuracy" and c.reference == "baseline")
    # Bootstrap upper bound ~ acc + 1.645 * sqrt(acc (1-acc) / 200), wider than Wilson at n=800.
    assert check.bound == pytest.approx(acc + 1.645 * (acc * (1 - acc) / 200) ** 0.5, abs=0.02)
    with pytest.raises(ValueError, match="records"):
        _gate(current, cfg, baseline=base)


def test_markdown_diff_table_lists_every_check(baseline: Any, make_eval: Any, nightly_cfg: Any) -> None:
    result = _gate(make_eval(0.45, format_valid_rate=0.3), nightly_cfg, baseline=baseline)
    md = render_gate_markdown(result, "nightly tiny papo_rl")
    assert md.startswith("## nightly tiny papo_rl: FAIL")
    rows = [line for line in md.splitlines() if line.startswith("| tiny_test")]
    assert len(rows) == len(result.checks)
    assert "| tiny_test | accuracy | baseline | 0.6000 | 0.4500 | -0.1500 |" in md


def test_baseline_keeps_the_benchmarks_the_nightly_runs(
    tmp_path: Path, make_eval: Any, tiny_cfg: Any
) -> None:
    ev = make_eval(0.6)
    benches = ev["checkpoints"]["papo_rl"]["benchmarks"]
    benches["aime24"] = dict(benches["tiny_test"], n_problems=3, n_samples=1, k=1)
    # The tiny profile's nightly runs tiny_test only: a baseline holding aime24 would fail every night.
    assert list(write_baseline(ev, tiny_cfg, tmp_path / "a.yaml").benchmarks) == ["tiny_test"]
    assert list(write_baseline(ev, tiny_cfg, tmp_path / "b.yaml", benchmarks=["aime24"]).benchmarks) == [
        "aime24"
    ]
    with pytest.raises(KeyError, match="math500"):
        write_baseline(ev, tiny_cfg, tmp_path / "c.yaml", benchmarks=["math500"])


def test_a_baseline_of_another_checkpoint_is_refused_unless_judging_a_candidate(
    baseline: Any, make_eval: Any, nightly_cfg: Any
) -> None:
    other = make_eval(0.6, checkpoint_hash="sha256:0ther")
    with pytest.raises(
        GateRefused, match=r"baseline of checkpoint sha256:feed .*is sha256:0ther.*npr nightly promote"
    ):
        _gate(other, nightly_cfg, baseline=baseline)
    # a candidate being promoted is judged against the old baseline by its numbers
    result = _gate(other, nightly_cfg, baseline=baseline, candidate=True)
    assert result.verdict == "pass" and not result.warnings()
    (hash_check,) = [c for c in result.checks if c.metric == "checkpoint_hash"]
    assert hash_check.current == "sha256:0ther" and "candidate" in hash_check.reason
    assert (
        _gate(
            make_eval(0.40, checkpoint_hash="sha256:0ther"), nightly_cfg, baseline=baseline, candidate=True
        ).verdict
        == "fail"
    )


def test_a_malformed_baseline_is_one_clear_error(tmp_path: Path, baseline: Any) -> None:
    from components.errors import UserError

    bad = tmp_path / "bad.yaml"
    bad.write_text("tag: x\nbenchmarks: [unclosed\n")
    with pytest.raises(UserError, match=rf"baseline {bad}: line \d+, column \d+: not valid YAML"):
        load_baseline(bad)
    text = (tmp_path / "tiny-papo_rl.yaml").read_text().replace("checkpoint_hash:", "checkpoint_hsh:")
    bad.write_text(text)
    with pytest.raises(UserError, match=rf"baseline {bad}: checkpoint_hash: Field required"):
        load_baseline(bad)
