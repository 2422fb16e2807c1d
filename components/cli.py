"""`npr`: the one command-line entry point. Every subcommand is a thin shell over a library function.

Errors: a user error (``components.errors.UserError``: a bad config, bad data, a malformed baseline; a
missing or unreadable file) is printed as one line naming the file and key, and ``npr`` exits with status
2; anything else is a bug and keeps its traceback (exit 1). ``--dry-run`` writes nothing.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table
from typer.core import TyperGroup

from components.env import apply_defaults
from components.errors import UserError
from components.ops.supervise import run_supervised
from components.tracking import own_wandb_service

# Not bugs: what the user has to fix (the messages name the file, the key, the line)
USER_ERRORS = (
    UserError,
    FileNotFoundError,
    IsADirectoryError,
    NotADirectoryError,
    PermissionError,
    ConnectionError,
)
USER_ERROR_EXIT = 2
# Set in the child that runs `npr run`'s flow under the supervising `npr run` (components.ops.supervise)
FLOW_CHILD_ENV = "NPR_RUN_FLOW_CHILD"


def user_error_line(err: BaseException) -> str:
    """The error as one line (an OSError with its file name)."""
    text = str(err)
    if isinstance(err, OSError) and err.filename is not None and err.strerror:
        text = f"{err.filename}: {err.strerror}"
    return " ".join(text.split())


class _UserErrorsAsOneLine(TyperGroup):
    """Runs the command; a user error becomes one red line on stderr and exit status 2, no traceback."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except USER_ERRORS as err:
            typer.secho(f"error: {user_error_line(err)}", fg=typer.colors.RED, err=True)
            raise typer.Exit(USER_ERROR_EXIT) from None


app = typer.Typer(
    cls=_UserErrorsAsOneLine,
    add_completion=False,
    no_args_is_help=True,
    help="Native Parallel Reasoner pipeline.",
)
config_app = typer.Typer(no_args_is_help=True, help="Show or materialise the typed config.")
data_app = typer.Typer(no_args_is_help=True, help="Raw input data (tracked by data.dvc).")
nightly_app = typer.Typer(
    no_args_is_help=True, help="The nightly regression gate: promote a checkpoint, run it."
)
app.add_typer(config_app, name="config")
app.add_typer(data_app, name="data")
app.add_typer(nightly_app, name="nightly")
storage_app = typer.Typer(no_args_is_help=True, help="The DVC remote's storage.")
app.add_typer(storage_app, name="storage")
verl_app = typer.Typer(no_args_is_help=True, help="The verl jobs of the RL stages (backend: verl).")
app.add_typer(verl_app, name="verl")
seed_app = typer.Typer(no_args_is_help=True, help="The tiny profile's instruct model (models/tiny-instruct).")
app.add_typer(seed_app, name="seed")

SetOpt = Annotated[list[str] | None, typer.Option("--set", "-s", help="Override a key: section.key=value")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the full result as JSON instead of a table")]


def _fail(msg: str, code: int = 2) -> None:
    typer.secho(msg, fg=typer.colors.RED, err=True)
    raise typer.Exit(code)


def _load(profile: str | None = None, overrides: list[str] | None = None):
    from components.config import load_config  # lazy: torch

    return load_config(profile=profile, overrides=overrides or [])  # a ConfigError is one line, exit 2


@config_app.command("show")
def config_show(
    profile: Annotated[str | None, typer.Option(help="Show this profile instead of params.yaml")] = None,
    set_: SetOpt = None,
) -> None:
    """Print the resolved, validated config."""
    from components.config import dump_yaml  # lazy: torch

    typer.echo(dump_yaml(_load(profile, set_)))


@config_app.command("check")
def config_check(
    profile: Annotated[str | None, typer.Option(help="Check this profile instead of params.yaml")] = None,
    set_: SetOpt = None,
    gpu: Annotated[
        str | None, typer.Option(help="Plan against this GPU kind of infra/gpus.yaml, not the declared one")
    ] = None,
) -> None:
    """Every static check of a profile: validation splits, memory plan per stage and GPU, context
    lengths, GPU counts per stage, Ray placement. Exits 1 when any check fails."""
    from components.config_check import check_profile  # lazy: torch

    cfg = _load(profile, set_)
    rows = check_profile(cfg, gpu)
    on = f" on {gpu}" if gpu else ""
    table = Table(title=f"npr config check: profile {cfg.profile}{on}", show_lines=False)
    for column in ("check", "stage", "result", "detail"):
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(row.check, row.stage, "[green]ok[/]" if row.ok else "[red]FAIL[/]", row.detail)
    Console(width=160).print(table)
    failed = [r for r in rows if not r.ok]
    if failed:
        _fail(f"{len(failed)} of {len(rows)} checks failed for profile {cfg.profile}{on}", 1)
    typer.echo(f"all {len(rows)} checks passed for profile {cfg.profile}{on}")


@config_app.command("estimate")
def config_estimate() -> None:
    """Every GPU profile on every GPU kind of infra/gpus.yaml: each stage's estimated hours and memory
    headroom, as the markdown table README.md carries."""
    from components.config import gpu_profiles  # lazy: torch
    from components.config_check import estimate_table  # lazy: torch

    typer.echo(estimate_table([_load(name) for name in gpu_profiles()]), nl=False)


@config_app.command("use")
def config_use(profile: str, set_: SetOpt = None) -> None:
    """Write configs/PROFILE.yaml (plus overrides) to params.yaml."""
    from components.config import materialise_profile  # lazy: torch

    cfg = materialise_profile(profile, set_ or [])
    typer.echo(f"params.yaml now holds profile {cfg.profile!r}")


@verl_app.command("launch")
def verl_launch(
    stage: str,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Validate and print the job; write nothing, submit nothing")
    ] = False,
    profile: Annotated[str | None, typer.Option(help="A profile instead of params.yaml")] = None,
) -> None:
    """Validate an RL stage's verl job with verl itself, print its settings and command, and (without
    --dry-run) write its inputs and submit it."""
    from components.training.verl.launch import launch  # lazy: verl

    cfg = _load(profile)
    code = launch(stage, cfg, dry_run=dry_run)
    if code is None:  # no running cluster: the stage starts its own Ray head, runs verl and merges
        from components.stages import run_stage  # lazy: torch

        metrics = run_stage(stage, cfg)
        _print_summary(stage, metrics, f"full record: artifacts/{stage}/metrics.json")
        return
    if code:
        raise typer.Exit(code)


@seed_app.command("build")
def seed_build(
    out: Annotated[Path | None, typer.Option(help="Model directory to write [models/tiny-instruct]")] = None,
    work: Annotated[Path | None, typer.Option(help="Resumable work dir [artifacts/seed-build/work]")] = None,
    steps: Annotated[int | None, typer.Option(help="Override seed.steps (a shorter build)")] = None,
    # One thread by default: on a shared 2-core machine two threads ran a step 4x slower than one (the
    # threads wait on each other whenever another process holds a core).
    threads: Annotated[int | None, typer.Option(help="Torch threads [$NPR_TORCH_THREADS or 1]")] = None,
    card_eval_n: Annotated[int | None, typer.Option(help="Validation problems in the card")] = None,
    set_: SetOpt = None,
) -> None:
    """Build the tiny instruct checkpoint from scratch with the tiny profile's `seed` recipe (hours on 2
    cores); writes the model, its card and checksums. Resumes from --work."""
    from components.training import tiny_seed  # lazy: torch
    from components.training.seed_job import seed_job  # lazy: startup

    configure_logging()
    cfg = _load("tiny", set_)
    card = tiny_seed.build(
        seed_job(None, cfg),  # a build outside the pipeline: no stage, no stage W&B run
        out or tiny_seed.DEFAULT_OUT,
        work or tiny_seed.DEFAULT_WORK,
        steps,
        threads or int(os.environ.get("NPR_TORCH_THREADS", "1")),
        tiny_seed.CARD_EVAL_N if card_eval_n is None else card_eval_n,
    )
    typer.echo(json.dumps(card["validation"]["sampled_t1"], indent=1))


@app.command("stage")
def stage(name: str, set_: SetOpt = None, as_json: JsonOpt = False) -> None:
    """Run one stage with params.yaml (this is the cmd of every dvc.yaml stage); ends with its summary."""
    from components.stages import run_stage  # lazy: torch

    if os.environ.get("NPR_RESTORE_ONLY"):
        # set while the flow restores a stage that ran on another machine (flows/stage.py): DVC found no
        # run-cache entry, and running a GPU stage here instead would be wrong
        _fail(
            f"stage {name} is being restored from the DVC run-cache (NPR_RESTORE_ONLY), but DVC found no "
            "cached run for it and tried to run it here: push its run-cache from the machine that ran it"
        )
    cfg = _load(None, set_)
    from components.training.distributed import is_main_process, torchrun_argv  # lazy: torch

    # A stage configured for several processes (FSDP SFT) reruns this very command under torchrun.
    this = sys.argv[0] if os.access(sys.argv[0], os.X_OK) else "npr"  # the npr script, as invoked
    relaunch = torchrun_argv(getattr(cfg.section(name), "nproc_per_node", 1), [this, *sys.argv[1:]])
    if relaunch is not None:
        os.execvp(relaunch[0], relaunch)
    metrics = run_stage(name, cfg)  # bad config/data: one line, exit 2; a bug: its traceback
    if not is_main_process():
        return
    if as_json:
        typer.echo(json.dumps({k: v for k, v in metrics.items() if k != "provenance"}, indent=2, default=str))
        return
    _print_summary(name, metrics, f"full record: artifacts/{name}/metrics.json")


def _print_summary(name: str, metrics: dict, where: str) -> None:
    """The stage's flat metrics (what `dvc metrics show` reads) as a short table; an evaluation as one row
    per checkpoint with its accuracy per benchmark."""
    from components.progress import print_table  # lazy: startup
    from components.reporting import checkpoint_summary, flatten, stage_summary  # lazy: torch

    if "checkpoints" in metrics:
        rows = [
            {"checkpoint": c, **flatten(checkpoint_summary(m))} for c, m in metrics["checkpoints"].items()
        ]
        print_table(name, rows, note=where)
    else:
        print_table(name, stage_summary(name, metrics), note=where)


@app.command("run")
def run(
    profile: Annotated[
        str | None, typer.Option(help="Materialise this profile into params.yaml first")
    ] = None,
    stages: Annotated[str | None, typer.Option(help="Comma-separated stages (default: all)")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the plan; run nothing")] = False,
    set_: SetOpt = None,
) -> None:
    """Run the pipeline (or some stages) as a Prefect flow; DVC decides what is stale.

    ``--profile`` rewrites params.yaml from configs/PROFILE.yaml (plus the overrides); ``--set`` alone
    changes only the keys it names in params.yaml (hand edits and `dvc exp run -S` values stay). With
    ``--dry-run`` nothing is written: the plan shows what the change would make stale.
    """
    from components.config import PARAMS_FILE, materialise_profile, override_params  # lazy: torch
    from components.dag import stage_order  # lazy: startup

    order = stage_order()
    selected = order if not stages else [s.strip() for s in stages.split(",") if s.strip()]
    unknown = [s for s in selected if s not in order]
    if unknown:
        _fail(f"unknown stage(s): {', '.join(unknown)}; known: {', '.join(order)}")
    if dry_run:
        from components.config import load_config  # lazy: torch
        from flows.pipeline import plan  # lazy: prefect

        current = _load() if PARAMS_FILE.exists() else None
        if profile:
            cfg = _load(profile, set_)
        elif current is None:
            _fail(f"{PARAMS_FILE} does not exist: give --profile (or run `npr config use PROFILE`)")
        else:
            cfg = load_config(PARAMS_FILE, overrides=set_ or []) if set_ else current
        for line in plan(cfg, selected, current=current):
            typer.echo(line)
        return
    if profile:
        materialise_profile(profile, set_ or [])
    elif set_:
        override_params(set_)
    cfg = _load()
    if not os.environ.get(FLOW_CHILD_ENV):
        from components.training.precision import run_precision  # lazy: torch

        # said once per run; every stage's record keeps it (provenance.precision)
        typer.echo(f"precision (run.autocast={cfg.run.autocast}): {run_precision(cfg.run).reason}")
        # The flow runs in a child process this one stops, with everything under it, within seconds of a
        # SIGINT/SIGTERM/SIGHUP, whatever Prefect's server is doing (components.ops.supervise).
        npr = Path(sys.executable).with_name("npr")
        child = [str(npr) if npr.exists() else "npr", "run", "--stages", ",".join(selected)]
        raise typer.Exit(run_supervised(child, {**os.environ, FLOW_CHILD_ENV: "1"}))
    from flows.pipeline import npr_pipeline  # lazy: prefect

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
    as_json: JsonOpt = False,
) -> None:
    """Populate data/ (ORZ problems and benchmarks) from a local directory or the hub."""
    from components.data.fetch import fetch_data  # lazy: startup

    cfg = _load()
    try:
        summary = fetch_data(cfg.sample_orz, dest=dest, source=from_)
    except (FileNotFoundError, ValueError, ConnectionError) as err:
        _fail(str(err), 1)
    summary["dvc"] = _track_with_dvc(dest)
    if as_json:
        typer.echo(json.dumps(summary, indent=2))
        return
    from components.progress import print_table  # lazy: startup

    # lists (files copied, skipped with their reasons) are counted here; --json lists them
    rows = {k: (len(v) if isinstance(v, list | dict) else v) for k, v in summary.items()}
    print_table("data fetch", rows, note="--json lists every file")


def _track_with_dvc(dest: Path) -> str:
    """`dvc add` the fetched directory: same content -> data.dvc unchanged, now also in the DVC cache (so
    `dvc status` is clean and `dvc push` can send it); new content -> data.dvc updated, to commit."""
    if not Path(".dvc").is_dir() or not Path(f"{dest}.dvc").exists():
        return "not tracked (no .dvc directory or no data.dvc here)"
    before = Path(f"{dest}.dvc").read_text()
    from components import storage  # lazy: startup

    try:
        storage.dvc_add(dest)
    except UserError as err:
        _fail(str(err), 1)
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
    from components.grading.cli_ops import grade_jsonl, grade_pair  # lazy: torch

    cfg = _load().grading if Path("params.yaml").exists() else None
    if jsonl is not None:
        counts = grade_jsonl(jsonl, sys.stdout, cfg)
        summary = ", ".join(f"{k} {v}" for k, v in counts.items())
        failed = counts["errors"] + counts["grade_failures"]
        typer.secho(f"{jsonl}: {summary}", err=True, fg=typer.colors.RED if failed else None)
        if failed:  # every line was written; the status says some could not be graded
            raise typer.Exit(1)
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
    from components.grading.cli_ops import check_format_text  # lazy: torch

    raw = sys.stdin.buffer.read() if file == "-" else Path(file).read_bytes()
    typer.echo(json.dumps(check_format_text(response_text(raw, file), schema), indent=2))


def response_text(raw: bytes, name: str) -> str:
    """A response file's text; a binary or non-UTF-8 file is a user error naming the file and offset."""
    nul = raw.find(b"\0")
    if nul >= 0:
        raise UserError(f"{name}: a binary file (NUL byte at offset {nul}), not a response")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise UserError(
            f"{name}: not UTF-8 text (byte 0x{raw[err.start]:02x} at offset {err.start})"
        ) from None


@app.command("eval")
def eval_(
    checkpoint: Annotated[Path, typer.Option(help="A model directory")],
    benchmarks: Annotated[
        str,
        typer.Option(
            help="Comma-separated benchmark names and/or benchmark files (.jsonl or .json: one object per "
            "problem with `problem` and `answer`, and optionally `id`; see --problem-field)"
        ),
    ],
    k: Annotated[int | None, typer.Option(help="Samples per problem (default: params.yaml)")] = None,
    mode: Annotated[str, typer.Option(help="parallel | sequential")] = "parallel",
    out: Annotated[Path, typer.Option(help="Output directory")] = Path("artifacts/adhoc_eval"),
    problem_field: Annotated[str, typer.Option(help="A benchmark file's problem field")] = "problem",
    answer_field: Annotated[
        str, typer.Option(help="A benchmark file's answer field (a string, a number or a list of them)")
    ] = "answer",
    id_field: Annotated[str, typer.Option(help="A benchmark file's id field (absent: the row index)")] = "id",
    set_: SetOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Evaluate one checkpoint ad hoc with the same code as the evaluate stage; ends with its table.

    A bad benchmark name or file is one line and exit status 2.
    """
    from components.data.benchmarks import FieldMap  # lazy: startup
    from components.evaluation.adhoc import evaluate_checkpoint  # lazy: torch

    cfg = _load(None, set_)
    names = [b.strip() for b in benchmarks.split(",") if b.strip()]
    fields = FieldMap(problem=problem_field, answer=answer_field, id=id_field)
    summary = evaluate_checkpoint(
        cfg, checkpoint=checkpoint, benchmarks=names, k=k, mode=mode, out_dir=out, fields=fields
    )
    if as_json:
        typer.echo(json.dumps(summary, indent=2, default=str))
    else:
        _print_summary("eval", summary.get("metrics", summary), f"full record: {out / 'metrics.json'}")
    if summary.get("report"):
        typer.echo(f"report: {summary['report']}")


def _nightly_profile(profile: str | None) -> str:
    """The profile the nightly evaluates with: ``--profile``, else params.yaml's, else tiny."""
    if profile:
        return profile
    from components.config import PARAMS_FILE  # lazy: torch

    return _load().profile if PARAMS_FILE.exists() else "tiny"


ProfileOpt = Annotated[str | None, typer.Option(help="Profile (default: params.yaml's)")]


@nightly_app.command("promote")
def nightly_promote(
    checkpoint: Annotated[str, typer.Argument(help="A model directory (artifacts/papo_rl/model) or a stage")],
    profile: ProfileOpt = None,
    force: Annotated[bool, typer.Option("--force", help="Promote even if the candidate regresses")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Evaluate CHECKPOINT once and make it the nightly's baseline (nightly.baseline_dir, DVC-tracked).

    A baseline of another checkpoint with the same settings is compared first (noise-aware); a regression
    refuses the promotion (exit 1) unless --force.
    """
    from flows.nightly import PromotionRefused, promote  # lazy: prefect

    name = _nightly_profile(profile)
    try:
        outcome = promote(name, checkpoint, force=force, command=f"npr nightly promote {checkpoint}")
    except PromotionRefused as err:
        _fail(f"error: {user_error_line(err)}", 1)
    if as_json:
        typer.echo(json.dumps(outcome, indent=2, default=str))
        return
    typer.echo(
        f"promoted {outcome['checkpoint']} ({outcome['checkpoint_hash']}): baseline {outcome['baseline']}"
    )
    if outcome["compared_with"]:
        typer.echo(f"previous baseline: {outcome['compared_with']}")
    typer.echo(f"dvc: {outcome['dvc']}")


@nightly_app.command("run")
def nightly_run(
    profile: ProfileOpt = None,
    checkpoint: Annotated[
        str | None, typer.Option(help="Model directory or stage (default: nightly.checkpoint)")
    ] = None,
    baseline: Annotated[
        str | None, typer.Option(help="Baseline tag or file (default: <profile>-<checkpoint>)")
    ] = None,
) -> None:
    """Run the nightly gate now (the `nightly-eval` flow; on the running Prefect server when there is one).

    Exit 0 on pass or warn, 1 on a regression (the alert file and webhook say so), 2 when the baseline is
    of another checkpoint or other settings (the message says what to run).
    """
    from flows.nightly import nightly_eval, preflight  # lazy: prefect

    name = _nightly_profile(profile)
    preflight(name, checkpoint, baseline)  # a user error or a refusal: one line, exit 2, no flow run
    state = nightly_eval(profile=name, checkpoint=checkpoint, baseline=baseline, return_state=True)
    if state.is_completed():
        summary = state.result()
        typer.echo(f"nightly gate: {summary['verdict'].upper()}; diff table: {summary['diff_table']}")
        for warning in summary["warnings"]:
            typer.echo(f"  warn {warning}")
        return
    try:
        data = state.result(raise_on_failure=False)
    except Exception as err:  # noqa: BLE001 - the flow's own exception, re-raised below when not the user's
        data = err
    if isinstance(data, BaseException):
        if isinstance(data, USER_ERRORS):
            raise data
        _fail(f"nightly gate ended in state {state.type.value}: {state.message}", 1)
    alert = data.get("alert_file") if isinstance(data, dict) else None
    _fail(
        f"nightly gate FAILED: {state.message}"
        + (f"; alert written to {alert} (webhook: {data.get('webhook')})" if alert else ""),
        1,
    )


@storage_app.command("init")
def storage_init(
    url: Annotated[str, typer.Argument(help="s3://bucket/prefix")],
    remote: Annotated[str, typer.Option(help="DVC remote name")] = "s3",
    create: Annotated[bool, typer.Option(help="Create the bucket when it does not exist")] = True,
    default: Annotated[bool, typer.Option(help="Make it DVC's default remote on this machine")] = True,
) -> None:
    """Create the bucket if allowed, point the DVC remote at it (.dvc/config.local), check a probe object."""
    from components.storage_init import init_s3  # lazy: startup

    done = init_s3(url, Path("."), remote=remote, create=create, default=default)
    typer.echo(f"bucket {done['bucket']}: {'created' if done['created'] else 'exists'}")
    typer.echo(
        f"DVC remote {done['remote']!r} = {url} in {done['config']}" + (" (default)" if default else "")
    )
    typer.echo(f"probe: {done['probe']}")
    typer.echo(
        f"the pipeline pushes to storage.remote: `npr run --set storage.remote={done['remote']}` to use it"
    )


@app.command("plots", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def plots(
    ctx: typer.Context,
    action: Annotated[str, typer.Argument(help="show | diff | template")] = "show",
) -> None:
    """`dvc plots show|diff [ARGS]` with the self-contained page (no CDN); `template` only writes the page.

    The page template (Vega inlined) is written to .dvc/tmp/ on first use; plain `dvc plots show` uses it
    too (.dvc/config names it), once any stage ran or `npr plots template` did.
    """
    from components.ops.plots_html import ensure_offline_template  # lazy: startup

    path = ensure_offline_template()
    if path is None:
        _fail("no .dvc/ directory here: run from the repository root")
    if action == "template":
        typer.echo(f"offline plots page template: {path}")
        return
    if action not in ("show", "diff"):
        _fail(f"unknown action {action!r}: show | diff | template")
    from components.storage import dvc_executable  # lazy: startup

    raise typer.Exit(subprocess.run([dvc_executable(), "plots", action, *ctx.args], check=False).returncode)


@app.command("server")
def server(
    host: str = "127.0.0.1",
    port: int = 4200,
    register: Annotated[bool, typer.Option(help="Create work pools and deployments")] = True,
) -> None:
    """Start a local Prefect server (UI on http://HOST:PORT) and register the deployments."""
    from components.config import load_orchestration  # lazy: torch
    from components.ops.prefect_ops import start_server  # lazy: startup

    start_server(load_orchestration(Path.cwd()), host=host, port=port, register=register)


@app.command("worker")
def worker(pool: Annotated[str, typer.Option(help="Work pool: cpu | gpu")] = "cpu") -> None:
    """Run a Prefect worker for a pool until Ctrl-C, SIGTERM or SIGHUP (which stop it and its flow runs)."""
    from components.config import load_orchestration  # lazy: torch
    from components.ops.prefect_ops import start_worker  # lazy: startup

    raise typer.Exit(start_worker(pool, load_orchestration(Path.cwd().resolve())))


def configure_logging() -> None:
    """The project's own INFO messages (a stage resuming from step N, a push retried, ...) on stderr;
    libraries keep their own levels."""
    logger = logging.getLogger("components")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False


def main() -> None:
    own_wandb_service()
    apply_defaults()
    configure_logging()
    app()
