"""`npr` on bad input: one line naming the file and key, exit 2, no traceback; a bug keeps its traceback;
--dry-run writes nothing; a batch isolates its bad lines and says so in its exit status."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from components.cli import app

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture()
def checkout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The files a command reads from a checkout (no DVC repository, so `dvc status` knows nothing)."""
    for name in ("dvc.yaml", "params.yaml", "prefect.yaml"):
        shutil.copy(REPO / name, tmp_path / name)
    for name in ("configs", "prompts"):
        shutil.copytree(REPO / name, tmp_path / name)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _invoke(*args: str, **kw) -> object:
    return CliRunner().invoke(app, list(args), **kw)


def _one_line_error(result, *needles: str) -> str:
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.output
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def test_dry_run_writes_nothing_and_shows_what_the_overrides_make_stale(checkout: Path) -> None:
    from components.config import override_params

    params = checkout / "params.yaml"
    override_params(["seed.eval_n=150"], params)  # a hand edit, as `dvc exp run -S seed.eval_n=150` makes
    before, mtime = params.read_bytes(), params.stat().st_mtime_ns

    def states(result) -> dict[str, str]:
        assert result.exit_code == 0, result.output
        assert params.read_bytes() == before and params.stat().st_mtime_ns == mtime, "params.yaml written"
        return {line.split()[0]: line for line in result.stdout.splitlines()[1:]}

    # --set changes only its key: the hand edit stays, so seed is not made stale
    plan = states(_invoke("run", "--dry-run", "--set", "npr_zero.steps=7"))
    assert "stale (params)" in plan["npr_zero"] and "stale (params)" in plan["evaluate"]
    assert "stale (params)" not in plan["seed"] and "stale (params)" not in plan["sample_orz"]
    # --profile starts from the profile file: the hand edit would go, and seed with it
    plan = states(_invoke("run", "--dry-run", "--profile", "tiny", "--set", "npr_zero.steps=7"))
    assert "stale (params)" in plan["seed"]
    assert _invoke("run", "--dry-run", "--profile", "qwen3-4b").stdout.startswith("profile qwen3-4b")
    assert params.read_bytes() == before


def test_config_errors_are_one_line_naming_file_and_key(checkout: Path) -> None:
    _one_line_error(
        _invoke("config", "show", "--set", "npr_zero.steps=true"), "npr_zero.steps", "params.yaml"
    )
    _one_line_error(
        _invoke("run", "--dry-run", "--set", "npr_zero.lr=[1,"), "npr_zero.lr=[1,", "not valid YAML"
    )
    _one_line_error(_invoke("run", "--set", "npr_zero.steps=abc"), "npr_zero.steps")
    (checkout / "params.yaml").write_text("profile: tiny\nrun:\n  seed: [0\n")
    _one_line_error(_invoke("config", "show"), "params.yaml: line", "not valid YAML")
    _one_line_error(_invoke("stage", "sample_orz"), "params.yaml: line")


def test_a_data_error_in_a_stage_is_one_line_and_a_bug_keeps_its_traceback(
    checkout: Path, monkeypatch
) -> None:
    import components.stages as stages
    from components.data.quality import DataQualityError

    def bad_data(name, cfg):
        raise DataQualityError(
            "only 5/8 rows passed ...; the audit is in artifacts/sample_orz/work/audit-failed"
        )

    monkeypatch.setattr(stages, "run_stage", bad_data)
    _one_line_error(_invoke("stage", "sample_orz"), "audit-failed")

    def bug(name, cfg):
        raise KeyError("a bug")

    monkeypatch.setattr(stages, "run_stage", bug)
    result = _invoke("stage", "sample_orz")
    assert result.exit_code == 1 and isinstance(result.exception, KeyError)


def test_check_format_on_a_binary_or_missing_file(tmp_path: Path) -> None:
    binary = tmp_path / "model.bin"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00")
    _one_line_error(_invoke("check-format", str(binary)), str(binary), "binary file")
    latin = tmp_path / "latin1.txt"
    latin.write_bytes("caf\xe9".encode("latin-1"))
    _one_line_error(_invoke("check-format", str(latin)), str(latin), "not UTF-8", "offset 3")
    _one_line_error(_invoke("check-format", str(tmp_path / "none.txt")), "none.txt", "No such file")


def test_grade_jsonl_isolates_a_non_utf8_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # no params.yaml: grading defaults
    path = tmp_path / "pairs.jsonl"
    lines = [json.dumps({"pred": "3", "gold": "3"}).encode(), b'{"pred": "\xff", "gold": "1"}', b"{bad json"]
    path.write_bytes(b"\n".join(lines) + b"\n")
    result = _invoke("grade", "--jsonl", str(path))
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [r.get("equal") for r in rows] == [True, None, None], "every line has its row, in order"
    assert "not UTF-8" in rows[1]["error"] and rows[1]["line"] == 2 and "\\xff" in rows[1]["raw"]
    assert result.exit_code == 1 and "errors 2" in result.stderr and "graded 1" in result.stderr
    path.write_bytes(lines[0] + b"\n")
    ok = _invoke("grade", "--jsonl", str(path))
    assert ok.exit_code == 0 and "errors 0" in ok.stderr


def test_the_verl_launch_dry_run_writes_nothing(checkout: Path) -> None:
    from components.artifacts import write_shards
    from components.data.synthetic import generate_problems
    problems = checkout / "artifacts" / "sample_orz" / "problems"
    write_shards(problems, [dict(p, split="train") for p in generate_problems(4, seed=1)], 1, stem="train")
    write_shards(problems, [dict(p, split="test") for p in generate_problems(2, seed=2)], 1, stem="test")
    before = sorted(p.relative_to(checkout) for p in checkout.rglob("*"))
    result = _invoke("verl", "launch", "npr_zero", "--dry-run")
    assert result.exit_code == 0, result.output
    assert "verl accepts the job" in result.output  # it printed the validated job
    assert sorted(p.relative_to(checkout) for p in checkout.rglob("*")) == before


def test_the_verl_launch_without_a_cluster_runs_the_stage_in_process(checkout: Path, monkeypatch) -> None:
    """No verl.ray_address: the job needs the Ray head its stage starts, so `npr verl launch` runs the stage
    through the library (once: no overrides written here, no `npr stage` subprocess)."""
    import subprocess

    import components.stages
    from components.artifacts import write_shards
    from components.data.synthetic import generate_problems

    problems = checkout / "artifacts" / "sample_orz" / "problems"
    write_shards(problems, [dict(p, split="train") for p in generate_problems(4, seed=1)], 1, stem="train")
    write_shards(problems, [dict(p, split="test") for p in generate_problems(2, seed=2)], 1, stem="test")
    ran: list[str] = []
    monkeypatch.setattr(components.stages, "run_stage", lambda name, cfg: ran.append(name) or {"steps": 2})
    monkeypatch.setattr(subprocess, "call", lambda *a, **k: pytest.fail(f"a subprocess was started: {a}"))
    result = _invoke("verl", "launch", "npr_zero")
    assert result.exit_code == 0, result.output
    assert ran == ["npr_zero"] and "starts its own Ray head" in result.output
    assert not (checkout / "artifacts" / "npr_zero" / "work").exists()


def test_the_verl_launch_on_a_cluster_submits_the_stage_as_the_pipeline_does(checkout: Path, monkeypatch) -> None:
    """With verl.ray_address the cluster reproduces the stage (infra/ray/job.yaml: dvc repro --pull there,
    push back), as the npr-stage flow submits it; no command naming this machine's paths is submitted."""
    import subprocess

    from components.artifacts import write_shards
    from components.config import materialise_profile
    from components.data.synthetic import generate_problems

    problems = checkout / "artifacts" / "sample_orz" / "problems"
    write_shards(problems, [dict(p, split="train") for p in generate_problems(4, seed=1)], 1, stem="train")
    write_shards(problems, [dict(p, split="test") for p in generate_problems(2, seed=2)], 1, stem="test")
    cluster = ["papo_rl.verl.ray_address=http://head:8265", "papo_rl.verl.shared_dir=/fsx"]
    materialise_profile("tiny", cluster, dest=checkout / "params.yaml")
    shutil.copytree(REPO / "infra" / "ray", checkout / "infra" / "ray")  # the job spec, as a checkout has it
    submitted: list[list[str]] = []

    def run(argv, env, timeout, check):
        submitted.append(argv)
        return subprocess.CompletedProcess(argv, 0)

    monkeypatch.setattr(subprocess, "run", run)
    result = _invoke("verl", "launch", "papo_rl")
    assert result.exit_code == 0, result.output
    [argv] = submitted
    assert argv[1:3] == ["job", "submit"] and argv[argv.index("--address") + 1] == "http://head:8265"
    assert "dvc repro --pull --single-item papo_rl" in argv[-1]
    assert str(checkout) not in " ".join(argv[argv.index("--") :])
    assert "dvc pull papo_rl" in result.output


def test_seed_build_is_an_npr_command_with_the_tiny_recipe(monkeypatch, tmp_path: Path) -> None:
    """`npr seed build` (no `python -m` entry inside components/): the tiny profile's `seed` recipe, with its
    overrides, the output and work dirs, the step override and the thread count passed through."""
    from components.training import tiny_seed

    seen = {}

    def fake_build(job, out, work, steps, threads, eval_n):
        # the tiny profile's job (its architecture), built outside any stage
        tiny = job.models.tiny is not None
        seen.update(tiny=tiny, stage=job.stage, lr=job.section.lr, out=out, work=work, steps=steps, threads=threads, n=eval_n)
        return {"validation": {"sampled_t1": {"accuracy": 0.5}}}

    monkeypatch.setattr(tiny_seed, "build", fake_build)
    result = _invoke("seed", "build", "--out", str(tmp_path / "m"), "--steps", "7", "--set", "seed.lr=0.001")
    assert result.exit_code == 0, result.output
    assert '"accuracy": 0.5' in result.output
    assert seen == {
        "tiny": True, "stage": None, "lr": 0.001, "out": tmp_path / "m", "work": tiny_seed.DEFAULT_WORK, "steps": 7,
        "threads": 1, "n": tiny_seed.CARD_EVAL_N,
    }  # fmt: skip
