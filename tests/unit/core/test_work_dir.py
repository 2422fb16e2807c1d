"""A resumable stage's work dir is kept only while its code, params and input *content* are unchanged."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

from components import fingerprint
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


def test_work_fingerprint_follows_params(in_repo: Path) -> None:
    cfg = load_config()
    base = work_fingerprint("npr_zero", cfg)
    assert work_fingerprint("npr_zero", load_config(overrides=["npr_zero.lr=0.1"])) != base
    assert work_fingerprint("npr_zero", load_config(overrides=["sr_rl.lr=0.1"])) == base


def _stage_dir(tmp_path: Path, repo_root: Path, monkeypatch) -> Path:
    """A directory with the repository's dvc.yaml and a seed model input, as cwd."""
    shutil.copy(repo_root / "dvc.yaml", tmp_path / "dvc.yaml")
    model = tmp_path / "artifacts" / "seed" / "model"
    model.mkdir(parents=True)
    (model / "model.safetensors").write_bytes(b"weights" * 1000)
    (model / "config.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    return model


def test_work_fingerprint_follows_input_content_not_mtimes(
    tmp_path: Path, repo_root: Path, monkeypatch
) -> None:
    cfg = load_config(path=repo_root / "params.yaml")
    model = _stage_dir(tmp_path, repo_root, monkeypatch)
    weights = model / "model.safetensors"
    first = work_fingerprint("npr_zero", cfg)
    # the same bytes written again (a re-pull, a copy-mode checkout, `cp` without -p): a new mtime and inode
    data = weights.read_bytes()
    weights.unlink()
    weights.write_bytes(data)
    os.utime(weights, ns=(1, 1))
    assert work_fingerprint("npr_zero", cfg) == first, "checkpoints survive a byte-identical rewrite"
    weights.write_bytes(data[:-1] + b"X")  # one byte differs: a new seed model
    assert work_fingerprint("npr_zero", cfg) != first
    (model / "extra.json").write_text("{}")
    assert len({first, work_fingerprint("npr_zero", cfg)}) == 2


def test_inputs_use_the_md5s_dvc_already_computed(tmp_path: Path, monkeypatch) -> None:
    dvc = Path(sys.executable).with_name("dvc")
    monkeypatch.chdir(tmp_path)
    subprocess.run([str(dvc), "init", "--no-scm", "-q"], check=True)
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.bin").write_bytes(b"a" * 4096)
    subprocess.run([str(dvc), "add", "-q", "data"], check=True)  # DVC hashes the files into its state db
    import dvc_data.hashfile.hash as dvc_hash

    def no_rehash(*args, **kwargs):
        raise AssertionError("an input DVC already hashed was read again")

    monkeypatch.setattr(dvc_hash, "file_md5", no_rehash)
    monkeypatch.setattr(fingerprint, "_md5", no_rehash)
    listing = fingerprint.inputs_listing([Path("data")])
    assert listing == [("data/a.bin", hashlib.md5(b"a" * 4096).hexdigest())]
