"""A resumable stage's work dir is kept only while its code, params and inputs are unchanged."""

from __future__ import annotations

from pathlib import Path

from components.artifacts import prepare_work_dir
from components.config import load_config
from components.fingerprint import work_fingerprint


def test_prepare_work_dir_keeps_only_a_matching_stamp(tmp_path: Path) -> None:
    work = tmp_path / "work"
    assert prepare_work_dir(work, "a") is False
    (work / "checkpoint-00000010").mkdir()
    assert prepare_work_dir(work, "a") is True and (work / "checkpoint-00000010").exists()
    assert prepare_work_dir(work, "b") is False and not (work / "checkpoint-00000010").exists()
    # a work dir without any stamp (left by an older version) is never trusted
    (work / "fingerprint.json").unlink()
    (work / "checkpoint-00000020").mkdir()
    assert prepare_work_dir(work, "b") is False and not (work / "checkpoint-00000020").exists()


def test_work_fingerprint_follows_params_and_inputs(in_repo: Path, tmp_path: Path, monkeypatch) -> None:
    cfg = load_config()
    base = work_fingerprint("npr_zero", cfg)
    assert work_fingerprint("npr_zero", load_config(overrides=["npr_zero.lr=0.1"])) != base
    assert work_fingerprint("npr_zero", load_config(overrides=["sr_rl.lr=0.1"])) == base
    # an input file rewritten (a new seed model) changes it too
    from components import fingerprint

    listing = [("artifacts/seed/model/model.safetensors", 10, 1)]
    monkeypatch.setattr(fingerprint, "inputs_listing", lambda paths: listing)
    first = work_fingerprint("npr_zero", cfg)
    listing[0] = ("artifacts/seed/model/model.safetensors", 10, 2)
    assert work_fingerprint("npr_zero", cfg) != first
