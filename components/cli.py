"""`npr`: the one command-line entry point. Every subcommand is a thin shell over a library function."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from components.env import apply_defaults

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Native Parallel Reasoner pipeline.")
config_app = typer.Typer(no_args_is_help=True, help="Show or materialise the typed config.")
data_app = typer.Typer(no_args_is_help=True, help="Raw input data (tracked by data.dvc).")
app.add_typer(config_app, name="config")
app.add_typer(data_app, name="data")

SetOpt = Annotated[list[str] | None, typer.Option("--set", "-s", help="Override a key: section.key=value")]


def _fail(msg: str, code: int = 2) -> None:
    typer.secho(msg, fg=typer.colors.RED, err=True)
    raise typer.Exit(code)


def _load(profile: str | None = None, overrides: list[str] | None = None):
    from components.config import ConfigError, load_config

    try:
        return load_config(profile=profile, overrides=overrides or [])
    except ConfigError as err:
        _fail(str(err))


@config_app.command("show")
def config_show(
    profile: Annotated[str | None, typer.Option(help="Show this profile instead of params.yaml")] = None,
    set_: SetOpt = None,
) -> None:
    """Print the resolved, validated config."""
    from components.config import dump_yaml

    typer.echo(dump_yaml(_load(profile, set_)))


@config_app.command("check")
def config_check(
    profile: Annotated[str | None, typer.Option(help="Check this profile instead of params.yaml")] = None,
    set_: SetOpt = None,
) -> None:
    """Every static check of a profile: validation splits, memory plan per stage and GPU, context
    lengths, GPU counts per stage, Ray placement. Exits 1 when any check fails."""
    from rich.console import Console
    from rich.table import Table

    from components.config_check import check_profile

    cfg = _load(profile, set_)
    rows = check_profile(cfg)
    table = Table(title=f"npr config check: profile {cfg.profile}", show_lines=False)
    for column in ("check", "stage", "result", "detail"):
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(row.check, row.stage, "[green]ok[/]" if row.ok else "[red]FAIL[/]", row.detail)
    Console(width=160).print(table)
    failed = [r for r in rows if not r.ok]
    if failed:
        _fail(f"{len(failed)} of {len(rows)} checks failed for profile {cfg.profile}", 1)
    typer.echo(f"all {len(rows)} checks passed for profile {cfg.profile}")


@config_app.command("use")
def config_use(profile: str, set_: SetOpt = None) -> None:
    """Write configs/PROFILE.yaml (plus overrides) to params.yaml."""
    from components.config import ConfigError, materialise_profile

    try:
        cfg = materialise_profile(profile, set_ or [])
    except ConfigError as err:
        _fail(str(err))
    typer.echo(f"params.yaml now holds profile {cfg.profile!r}")


@app.command("stage")
def stage(name: str, set_: SetOpt = None) -> None:
    """Run one stage with params.yaml (this is the cmd of every dvc.yaml stage)."""
    import os

    from components.dag import DagError
    from components.stages import run_stage

    if os.environ.get("NPR_RESTORE_ONLY"):
        # set while the flow restores a stage that ran on another machine (flows/stage.py): DVC found no
        # run-cache entry, and running a GPU stage here instead would be wrong
        _fail(
            f"stage {name} is being restored from the DVC run-cache (NPR_RESTORE_ONLY), but DVC found no "
            "cached run for it and tried to run it here: push its run-cache from the machine that ran it"
        )
    cfg = _load(None, set_)
    # A stage configured for several processes (FSDP SFT) reruns this very command under torchrun.

    from components.training.distributed import is_main_process, torchrun_argv

    this = sys.argv[0] if os.access(sys.argv[0], os.X_OK) else "npr"  # the npr script, as invoked
    relaunch = torchrun_argv(getattr(getattr(cfg, name, None), "nproc_per_node", 1), [this, *sys.argv[1:]])
    if relaunch is not None:
        os.execvp(relaunch[0], relaunch)
    try:
        metrics = run_stage(name, cfg)
    except (DagError, ValueError) as err:
        _fail(f"stage {name} failed: {err}", 1)
    if is_main_process():
        typer.echo(json.dumps({k: v for k, v in metrics.items() if k != "provenance"}, indent=2, default=str))


@app.command("run")
def run(
    profile: Annotated[
        str | None, typer.Option(help="Materialise this profile into params.yaml first")
    ] = None,
    stages: Annotated[str | None, typer.Option(help="Comma-separated stages (default: all)")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the plan; run nothing")] = False,
    set_: SetOpt = None,
) -> None:
    """Run the pipeline (or some stages) as a Prefect flow; DVC decides what is stale."""
    from components.config import materialise_profile
    from components.dag import stage_order

    if profile or set_:
        materialise_profile(profile or _load().profile, set_ or [])
    cfg = _load()
    order = stage_order()
    selected = order if not stages else [s.strip() for s in stages.split(",") if s.strip()]
    unknown = [s for s in selected if s not in order]
    if unknown:
        _fail(f"unknown stage(s): {', '.join(unknown)}; known: {', '.join(order)}")
    if dry_run:
        from flows.pipeline import plan

        for line in plan(cfg, selected):
            typer.echo(line)
        return
    from flows.pipeline import npr_pipeline

    state = npr_pipeline(profile=cfg.profile, stages=selected, return_state=True)
    if not state.is_completed():
        _fail(f"pipeline ended in state {state.type.value}: {state.message}", 1)
    report = Path(cfg.run.artifacts_dir) / "evaluate" / "report" / "report.md"
    if report.exists():
        typer.echo(f"report: {report}")


@data_app.command("fetch")
def data_fetch(
    from_: Annotated[
        Path | None, typer.Option("--from", help="Copy raw data from this local directory")
    ] = None,
    dest: Annotated[Path, typer.Option(help="Destination tracked by data.dvc")] = Path("data"),
) -> None:
    """Populate data/ (ORZ problems and benchmarks) from a local directory or the hub."""
    from components.data.fetch import fetch_data

    cfg = _load()
    try:
        summary = fetch_data(cfg, dest=dest, source=from_)
    except (FileNotFoundError, ValueError, ConnectionError) as err:
        _fail(str(err), 1)
    summary["dvc"] = _track_with_dvc(dest)
    typer.echo(json.dumps(summary, indent=2))


def _track_with_dvc(dest: Path) -> str:
    """`dvc add` the fetched directory: same content -> data.dvc unchanged, now also in the DVC cache (so
    `dvc status` is clean and `dvc push` can send it); new content -> data.dvc updated, to commit."""
    import subprocess

    if not Path(".dvc").is_dir() or not Path(f"{dest}.dvc").exists():
        return "not tracked (no .dvc directory or no data.dvc here)"
    before = Path(f"{dest}.dvc").read_text()
    dvc = Path(sys.executable).with_name("dvc")
    proc = subprocess.run([str(dvc), "add", "-q", str(dest)], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        _fail(f"dvc add {dest} failed:\n{proc.stderr or proc.stdout}", 1)
    return "unchanged" if Path(f"{dest}.dvc").read_text() == before else f"updated {dest}.dvc (commit it)"


@app.command("grade")
def grade(
    pred: Annotated[str | None, typer.Option(help="Predicted answer or full response")] = None,
    gold: Annotated[str | None, typer.Option(help="Gold answer")] = None,
    jsonl: Annotated[
        Path | None, typer.Option(help="JSONL with pred/gold fields; writes lines with `equal`")
    ] = None,
) -> None:
    """Grade one (pred, gold) pair (prints true/false) or a JSONL file (to stdout)."""
    from components.grading.cli_ops import grade_jsonl, grade_pair

    cfg = _load().grading if Path("params.yaml").exists() else None
    if jsonl is not None:
        grade_jsonl(jsonl, sys.stdout, cfg)
        return
    if pred is None or gold is None:
        _fail("give --pred and --gold, or --jsonl FILE")
    typer.echo("true" if grade_pair(pred, gold, cfg) else "false")


@app.command("check-format")
def check_format(
    file: Annotated[str, typer.Argument(help="A file with one response, or - for stdin")] = "-",
    schema: Annotated[str, typer.Option(help="npr | multiverse | parallel_r1")] = "npr",
) -> None:
    """Print {valid, score, violations} for a response, as JSON."""
    from components.grading.cli_ops import check_format_text

    text = sys.stdin.read() if file == "-" else Path(file).read_text(encoding="utf-8")
    typer.echo(json.dumps(check_format_text(text, schema), indent=2))


@app.command("eval")
def eval_(
    checkpoint: Annotated[Path, typer.Option(help="A model directory")],
    benchmarks: Annotated[str, typer.Option(help="Comma-separated benchmark names")],
    k: Annotated[int | None, typer.Option(help="Samples per problem (default: params.yaml)")] = None,
    mode: Annotated[str, typer.Option(help="parallel | sequential")] = "parallel",
    out: Annotated[Path, typer.Option(help="Output directory")] = Path("artifacts/adhoc_eval"),
    set_: SetOpt = None,
) -> None:
    """Evaluate one checkpoint ad hoc with the same code as the evaluate stage."""
    from components.evaluation.adhoc import evaluate_checkpoint

    cfg = _load(None, set_)
    names = [b.strip() for b in benchmarks.split(",") if b.strip()]
    try:
        summary = evaluate_checkpoint(
            cfg, checkpoint=checkpoint, benchmarks=names, k=k, mode=mode, out_dir=out
        )
    except (FileNotFoundError, ValueError, KeyError) as err:
        _fail(f"eval failed: {err}", 1)
    typer.echo(json.dumps(summary, indent=2, default=str))
    if summary.get("report"):
        typer.echo(f"report: {summary['report']}")


@app.command("server")
def server(
    host: str = "127.0.0.1",
    port: int = 4200,
    register: Annotated[bool, typer.Option(help="Create work pools and deployments")] = True,
) -> None:
    """Start a local Prefect server (UI on http://HOST:PORT) and register the deployments."""
    from components.ops.prefect_ops import start_server

    start_server(host=host, port=port, register=register)


@app.command("worker")
def worker(pool: Annotated[str, typer.Option(help="Work pool: cpu | gpu")] = "cpu") -> None:
    """Start a Prefect worker for a pool."""
    from components.ops.prefect_ops import start_worker

    start_worker(pool)


def main() -> None:
    apply_defaults()
    app()


if __name__ == "__main__":
    main()
