"""Every stage gets its W&B run from the stage runner, with references to what it consumed and produced,
and rejection reasons as categories; read back from W&B's offline files (real wandb service, offline)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from wandb_records import by_type, read_records, run_files

from components.config import load_config
from components.dag import StageIO
from components.stages import run_stage
from components.storage import dvc_md5
from components.tracking import PIPELINE_RUN_ENV, RUN_ID_FILE

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # sample_orz and reject_filter import GX (~5 s)

GOOD = "<guideline><plan>1: add</plan></guideline><step>1: 2+3=5</step><takeaway>so 5</takeaway> \\boxed{5}"


def _trajectory(pid: str, idx: int, **over) -> dict:
    rec = {
        "problem_id": pid, "sample_idx": idx, "problem": "2+3", "answer": "5", "difficulty": "easy",
        "prompt": "p", "response": f"{GOOD} #{idx}", "n_tokens": 20, "answer_pred": "5", "correct": True,
        "format_score": 0.0, "valid": True, "finish_reason": "stop", "structure": {"parallel_taken": False},
    }  # fmt: skip
    return rec | over


@pytest.fixture()
def wandb_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    import wandb

    wandb.teardown()  # W&B fixes its root at the first init of a process
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv(PIPELINE_RUN_ENV, "run-stage-wandb")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    return tmp_path


def _records_of(wandb_dir: Path, work: Path) -> list:
    run_id = (work / RUN_ID_FILE).read_text().strip()
    (path,) = run_files(wandb_dir, run_id)
    return read_records(path)


def _summary(records: list) -> dict:
    return {u.key: json.loads(u.value_json) for s in by_type(records, "summary") for u in s.update if u.key}


def _config(records: list) -> dict:
    return {u.key: json.loads(u.value_json) for c in by_type(records, "config") for u in c.update if u.key}


def test_data_stages_get_runs_references_and_rejection_categories(
    wandb_dir: Path, tmp_path: Path, in_repo: Path
) -> None:
    cfg = load_config(profile="tiny")
    cfg.sample_orz = cfg.sample_orz.model_copy(
        update={"synthetic_pool": 1200, "n": 150, "test_n": 40, "val_n": 20}
    )
    root = tmp_path / "artifacts"
    sample = StageIO(
        stage="sample_orz",
        outputs={"problems": root / "sample_orz/problems", "audit": root / "sample_orz/audit"},
        metrics=root / "sample_orz/metrics.json",
    )
    cfg.storage = cfg.storage.model_copy(update={"remote": "s3"})  # the production remote's URIs
    run_stage("sample_orz", cfg, sample)
    records = _records_of(wandb_dir, root / "sample_orz/work")
    (info,) = by_type(records, "run")
    assert (info.job_type, info.run_group) == ("sample_orz", "run-stage-wandb")
    summary = _summary(records)
    assert summary["sample_orz/n_train"] == 150 and summary["sample_orz/n_test"] == 40
    produced = {a.name: a for a in by_type(records, "artifact")}
    assert set(produced) == {"sample_orz-problems", "sample_orz-audit"}
    problems = produced["sample_orz-problems"]
    md5 = dvc_md5(root / "sample_orz/problems")["md5"]  # what dvc.lock will record for this output
    assert md5.endswith(".dir") and problems.type == "dataset"
    (entry,) = problems.manifest.contents
    assert entry.ref.endswith(f"/files/md5/{md5[:2]}/{md5[2:]}")  # the DVC remote object, content-addressed
    assert entry.ref.startswith("s3://npr-pipeline-dvc/store/")  # the bucket of .dvc/config's s3 remote
    assert json.loads(problems.metadata)["md5"] == md5
    assert _config(records)["outputs/sample_orz/problems"]["uri"] == entry.ref

    trajectories = root / "distill/trajectories"
    from components.artifacts import write_shards

    write_shards(
        trajectories,
        [
            _trajectory("a", 0),
            _trajectory("a", 1, correct=False),
            _trajectory("b", 0, valid=False, format_score=-1.0),
            _trajectory("b", 1),
            _trajectory("c", 0, finish_reason="length"),
            _trajectory("c", 1),
        ],
        n_shards=1,
    )
    rf = root / "reject_filter"
    io = StageIO(
        stage="reject_filter",
        inputs={"distill/trajectories": trajectories},
        outputs={"accepted": rf / "accepted", "audit": rf / "audit"},
        metrics=rf / "metrics.json",
    )
    cfg.storage = cfg.storage.model_copy(update={"remote": "local"})  # tiny's: file:// URIs
    run_stage("reject_filter", cfg, io)
    records = _records_of(wandb_dir, rf / "work")
    assert by_type(records, "run")[0].job_type == "reject_filter"
    summary = _summary(records)
    assert (summary["reject_filter/accepted"], summary["reject_filter/sampled"]) == (3, 6)
    # the filter's reasons are categories (a fixed set of rule names), never record text
    assert summary["reject_filter/rejected/wrong"] == 1 and summary["reject_filter/rejected/format"] == 1
    assert summary["reject_filter/rejected/truncated"] == 1
    consumed = _config(records)["inputs/distill/trajectories"]
    md5 = dvc_md5(trajectories)["md5"]
    assert consumed["md5"] == md5 and consumed["uri"].endswith(f"/files/md5/{md5[:2]}/{md5[2:]}")
    # a local remote's object exists only after the flow pushes it: the reference is in the config
    produced = _config(records)["outputs/reject_filter/accepted"]
    assert produced["uri"].startswith("file://") and produced["uri"].endswith(produced["md5"][2:])
    assert produced["md5"] == dvc_md5(rf / "accepted")["md5"]


def test_rl_rejections_are_counted_by_category(tmp_path: Path) -> None:
    """The RL trainer logs ``rollout/rejected/<code>``; the messages go to the stage's records only."""
    from components.reporting import RL_REJECTIONS_LOG, rejection_categories

    log = tmp_path / RL_REJECTIONS_LOG
    rows = [
        {"step": 1, "segment": "a", "reason": "unclosed_block", "detail": "<step> never closed (at 63)"},
        {"step": 2, "segment": "a", "reason": "misplaced_tag", "detail": "</plan> not allowed inside a step (at 70)"},
        {"step": 2, "segment": "a", "reason": "misplaced_tag", "detail": "</plan> not allowed inside a step (at 9)"},
        # the process died after step 2 and its successor resumed from the step-1 checkpoint: step 2 again
        {"step": 2, "segment": "b", "reason": "misplaced_tag", "detail": "</plan> not allowed inside a step (at 70)"},
    ]  # fmt: skip
    log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert rejection_categories({}, tmp_path) == {"misplaced_tag": 1, "unclosed_block": 1}
    with pytest.raises(ValueError, match="free text"):
        rejection_categories({"reasons": {f"message {i}": 1 for i in range(100)}})


def test_a_local_remote_output_is_logged_as_an_artifact_after_the_push(
    wandb_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The default setup (local DVC remote): the reference is kept while the object is not on the remote,
    and logged into the stage's own run once the stage's push put it there (W&B's lineage has it)."""
    import shutil

    from ops_testing import VENV_BIN, run

    from components.artifacts import write_shards
    from components.tracking import PENDING_REFS_FILE, publish_pending_references

    # a checkout with the shipped .dvc/config (its local remote, ../dvc-remote)
    here = Path(__file__).resolve().parents[3]
    repo = tmp_path / "repo"
    for name in ("prompts", "configs", ".dvc"):
        shutil.copytree(
            here / name, repo / name, ignore=shutil.ignore_patterns("tmp", "cache", "config.local")
        )
    for name in ("dvc.yaml", "params.yaml"):
        shutil.copy(here / name, repo / name)
    run(["git", "init", "-q"], repo)
    monkeypatch.chdir(repo)
    cfg = load_config(profile="tiny")
    root = repo / "artifacts"
    trajectories = root / "distill/trajectories"
    write_shards(trajectories, [_trajectory("a", 0), _trajectory("b", 0, correct=False)], n_shards=1)
    rf = root / "reject_filter"
    io = StageIO(
        stage="reject_filter",
        inputs={"distill/trajectories": trajectories},
        outputs={"accepted": rf / "accepted", "audit": rf / "audit"},
        metrics=rf / "metrics.json",
    )
    run_stage("reject_filter", cfg, io)
    first = _records_of(wandb_dir, rf / "work")
    assert by_type(first, "artifact") == []  # the object is not on the remote yet
    pending = {r["name"]: r for r in json.loads((rf / "work" / PENDING_REFS_FILE).read_text())}
    assert set(pending) == {"reject_filter/accepted", "reject_filter/audit"}
    assert all(r["uri"].startswith("file://") for r in pending.values())

    assert publish_pending_references(cfg, "reject_filter", rf / "work") == 0  # still not pushed: nothing
    # the stage's push: DVC puts the output's objects on the local remote (here from a scratch DVC project
    # holding the same bytes, so the same md5 objects, pushed to this checkout's remote)
    dvc, scratch = str(VENV_BIN / "dvc"), tmp_path / "scratch"
    shutil.copytree(rf / "accepted", scratch / "accepted")
    run([dvc, "init", "--no-scm", "-q"], scratch)
    run([dvc, "remote", "add", "-d", "r", str(repo / "dvc-remote")], scratch)
    run([dvc, "add", "-q", "accepted"], scratch)
    run([dvc, "push", "-q"], scratch)
    assert publish_pending_references(cfg, "reject_filter", rf / "work") == 1
    # the audit was not pushed here: it stays pending for the next push
    assert [r["name"] for r in json.loads((rf / "work" / PENDING_REFS_FILE).read_text())] == [
        "reject_filter/audit"
    ]

    run_id = (rf / "work" / RUN_ID_FILE).read_text().strip()
    segments = run_files(wandb_dir, run_id)
    assert len(segments) == 2  # the same run, resumed after the push
    (artifact,) = by_type(read_records(segments[-1]), "artifact")
    assert artifact.name == "reject_filter-accepted" and artifact.type == "dataset"
    (entry,) = artifact.manifest.contents
    md5 = dvc_md5(rf / "accepted")["md5"]
    assert entry.ref == pending["reject_filter/accepted"]["uri"] and entry.ref.endswith(
        f"/files/md5/{md5[:2]}/{md5[2:]}"
    )
    assert Path(entry.ref.removeprefix("file://")).exists()  # the pushed object itself
