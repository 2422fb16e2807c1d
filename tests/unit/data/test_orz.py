"""ORZ raw reader: normalisation, truncated files, wrong schemas."""

from __future__ import annotations

import json

import pytest

from components.data.orz import OrzFormatError, load_orz_rows, normalise_item, read_orz_file, recover_items
from components.data.problems import content_id
from tests.conftest import SHARED_DATA

SHARED_ORZ = SHARED_DATA / "orz"


def _item(problem, answer):
    return [{"from": "human", "value": problem}, {"from": "assistant", "ground_truth": {"value": answer}}]


def test_normalise_item_strips_and_hashes():
    row = normalise_item(_item("  What is 2+2? ", " 4 "), "f.json#3")
    assert row == {
        "id": content_id("What is 2+2?", "4"),
        "problem": "What is 2+2?",
        "answer": "4",
        "source": "orz",
        "difficulty": None,
        "origin": "f.json#3",
    }
    assert normalise_item(_item("Q?", 27.0), "x")["answer"] == "27"


def test_malformed_items_become_rows_with_missing_fields_not_dropped():
    assert normalise_item("just a string", "f#0")["problem"] is None
    no_truth = [{"from": "human", "value": "Q?"}, {"from": "assistant"}]
    row = normalise_item(no_truth, "f#1")
    assert row["problem"] == "Q?" and row["answer"] is None


def test_truncated_file_error_names_the_recovery_and_recovery_keeps_complete_items(tmp_path):
    items = [_item(f"Problem number {i}?", str(i)) for i in range(3)]
    text = json.dumps(items, indent=4)
    cut = text[: text.rindex('"value": "2"') + 5]  # cut inside the last item
    path = tmp_path / "cut.json"
    path.write_text(cut)
    with pytest.raises(OrzFormatError, match=r"2 complete items.*recover_truncated=true"):
        read_orz_file(path)
    got, info = read_orz_file(path, recover_truncated=True)
    assert got == items[:2]
    end_of_second = cut.rindex("],\n    [") + 1  # the separator before the third (cut) item
    assert info.truncated and info.items == 2 and info.bytes_dropped == len(cut) - end_of_second


def test_recover_items_on_complete_list_and_on_garbage():
    items, _ = recover_items(json.dumps([[1], [2]]))
    assert items == [[1], [2]]
    with pytest.raises(OrzFormatError):
        recover_items('{"a": 1}')


def test_eval_schema_and_non_orz_files_raise(tmp_path):
    (tmp_path / "eval.json").write_text(
        json.dumps([{"prompt": [{"from": "user", "value": "Q"}], "final_answer": "1"}])
    )
    with pytest.raises(OrzFormatError, match="eval data"):
        read_orz_file(tmp_path / "eval.json")
    (tmp_path / "other.json").write_text(json.dumps([1, 2, 3]))
    with pytest.raises(OrzFormatError, match="no item looks like"):
        read_orz_file(tmp_path / "other.json")
    with pytest.raises(FileNotFoundError, match="npr data fetch"):
        load_orz_rows(tmp_path / "missing")


def test_invalid_utf8_bytes_survive_as_surrogates(tmp_path):
    raw = json.dumps([_item("Bad byte here: X", "1")]).encode().replace(b"X", b"\xff")
    (tmp_path / "bad.json").write_bytes(raw)
    rows, _ = load_orz_rows(tmp_path / "bad.json")
    assert rows[0]["problem"] == "Bad byte here: \udcff"


@pytest.mark.skipif(not SHARED_ORZ.is_dir(), reason="shared ORZ subset not on this machine")
def test_shared_orz_subset_counts():
    rows, infos = load_orz_rows(SHARED_ORZ / "partial_truncated", recover_truncated=True)
    assert len(rows) == 2725 and infos[0].truncated
    rows, infos = load_orz_rows(SHARED_ORZ / "orz_math_57k_collected_w_num_correct_n_2048_rollouts_4.json")
    assert len(rows) == 2048 and not infos[0].truncated
    assert rows[0]["answer"] == "n = 4" and rows[0]["origin"].endswith("#0")


def test_wrong_typed_fields_keep_their_raw_value():
    row = normalise_item(_item(123456, "7"), "f#0")
    assert row["problem"] is None and row["raw_fields"] == {"problem": {"type": "int", "value": 123456}}
    for answer, kind, raw in [
        (float("nan"), "float", "NaN"),
        (float("-inf"), "float", "-Infinity"),
        (True, "bool", True),
        ([1, 2], "list", [1, 2]),
        ({"a": 1}, "dict", {"a": 1}),
    ]:
        row = normalise_item(_item("What is it?", answer), "f#1")
        assert row["answer"] is None and row["raw_fields"] == {"answer": {"type": kind, "value": raw}}
    # finite numbers are answers; a missing answer is just missing (no raw value to keep)
    assert normalise_item(_item("Q?", 2.5), "x")["answer"] == "2.5"
    assert "raw_fields" not in normalise_item(_item("Q?", None), "x")


def test_a_json_nan_answer_is_read_as_a_wrong_typed_value(tmp_path):
    (tmp_path / "nan.json").write_text(
        '[[{"from": "human", "value": "What is 0/0?"}, '
        '{"from": "assistant", "ground_truth": {"value": NaN}}]]'
    )
    (row,), _ = load_orz_rows(tmp_path / "nan.json")
    assert row["answer"] is None and row["raw_fields"]["answer"] == {"type": "float", "value": "NaN"}
