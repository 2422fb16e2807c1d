"""The GX quality gate on a crafted bad ORZ file: every kind of bad row caught, counts reconcile."""

from __future__ import annotations

import json

import pytest

from components.data.orz import load_orz_rows
from components.data.quality import DataQualityError, QualityRules, validate_problems, write_audit

RULES = QualityRules(min_problem_chars=5, max_problem_chars=60, max_answer_chars=10, min_kept_fraction=0.1)


def _item(problem, answer):
    return [{"from": "human", "value": problem}, {"from": "assistant", "ground_truth": {"value": answer}}]


# origin index -> expected quarantine reasons (None = kept, "dup:<reason>" = duplicate)
CASES = [
    (_item("What is 1 + 1?", "2"), None),
    ([{"from": "human"}, {"from": "assistant", "ground_truth": {"value": "3"}}], ["problem_missing"]),
    ([{"from": "human", "value": "What is 2 + 2?"}, {"from": "assistant"}], ["answer_missing"]),
    (_item("   ", "1"), ["problem_empty", "problem_too_short"]),
    (_item("Hi?", "1"), ["problem_too_short"]),
    (_item("Long " * 20, "1"), ["problem_too_long"]),
    (_item("What is 3 + 3?", "6" * 11), ["answer_too_long"]),
    (_item("What is \u0000 4 + 4?", "8"), ["problem_invalid_text"]),
    (_item("What is BADBYTE 5 + 5?", "10"), ["problem_invalid_text"]),
    (_item("What  is 1 +\n1?", "2"), "dup:duplicate_id"),
    (_item("What is 1 + 1?", "3"), "dup:duplicate_problem"),
    ("not an item at all", ["problem_missing", "answer_missing"]),
    (_item("What is 6 + 6?", ""), ["answer_empty"]),
    (_item("What is 7 + 7?", "14"), None),
]


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    path = tmp_path_factory.mktemp("orz") / "bad.json"
    raw = json.dumps([item for item, _ in CASES]).encode().replace(b"BADBYTE", b"\xc3\x28")
    path.write_bytes(raw)
    rows, _ = load_orz_rows(path)
    return rows, validate_problems(rows, RULES)


def test_each_kind_of_bad_row_is_caught_with_its_reason(report):
    _, rep = report
    quarantined = {int(r["origin"].split("#")[1]): sorted(r["reasons"]) for r in rep.quarantined}
    expected = {i: sorted(want) for i, (_, want) in enumerate(CASES) if isinstance(want, list)}
    assert quarantined == expected
    dups = {int(r["origin"].split("#")[1]): r["reason"] for r in rep.duplicates}
    assert dups == {9: "duplicate_id", 10: "duplicate_problem"}
    by_origin = {r["origin"]: r for r in rep.duplicates}
    assert by_origin["bad.json#10"]["answer_conflict"] is True
    assert by_origin["bad.json#9"]["duplicate_of"] == rep.kept[0]["id"]
    assert [r["origin"] for r in rep.kept] == ["bad.json#0", "bad.json#13"]


def test_reconciliation_balances_and_floor_fails_loudly(report):
    rows, rep = report
    rec = rep.reconciliation()
    assert rec["rows_in"] == len(CASES) == rec["kept"] + rec["quarantined"] + rec["duplicates"]
    assert (rec["kept"], rec["quarantined"], rec["duplicates"]) == (2, 10, 2)
    assert rec["balanced"] and rec["quarantine_reasons"]["problem_invalid_text"] == 2
    failing = [e for e in rec["expectations"] if not e["success"]]
    assert {e["reason"] for e in failing} >= {"problem_missing", "duplicate_problem", "answer_too_long"}
    rep.raise_for_floor()  # 2/14 = 0.143 >= 0.1: passes
    strict = validate_problems(rows, QualityRules(5, 60, 10, min_kept_fraction=0.5))
    with pytest.raises(DataQualityError, match=r"only 2/14 rows .* below sample_orz.min_kept_fraction=0.5"):
        strict.raise_for_floor()


def test_audit_files_keep_every_removed_row_exactly(report, tmp_path):
    rows, rep = report
    write_audit(rep, tmp_path)
    quarantine = [json.loads(line) for line in (tmp_path / "quarantine.jsonl").read_text().splitlines()]
    duplicates = [json.loads(line) for line in (tmp_path / "duplicates.jsonl").read_text().splitlines()]
    assert len(quarantine) == 10 and len(duplicates) == 2
    bad_byte_row = next(r for r in quarantine if r["origin"] == "bad.json#8")
    assert bad_byte_row["problem"] == rows[8]["problem"]  # the undecodable bytes survive as escapes
    rec = json.loads((tmp_path / "reconciliation.json").read_text())
    assert rec["rows_in"] == rec["kept"] + rec["quarantined"] + rec["duplicates"]
    html = (tmp_path / "gx_docs" / "problem_rows.html").read_text()
    assert html.lstrip().lower().startswith("<!doctype html") and "problem_rows" in html
    assert (tmp_path / "gx_docs" / "index.html").exists()
