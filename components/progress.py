"""Progress of long work (training steps, rollouts, decoding, grading, data checks) and end-of-run tables.

Two audiences, told apart by whether stderr is a terminal (rich's own detection, ``Console.is_terminal``;
``NPR_PROGRESS=tty|plain|off`` forces a mode):

- a person at a terminal gets live rich bars, ``transient`` so that a finished bar makes room for the next
  and the final summary table stands alone;
- a log (DVC and Prefect capture the stage's output, CI, ``| tee``) gets plain lines, never a redraw: a
  ``step``-level task writes a line when it starts, each time it crosses another tenth of its total, and
  when it ends (at most a dozen lines, whatever the number of steps); a ``detail``-level task (a sub-step:
  one decode batch of many) writes nothing, so nested loops cannot multiply lines.

The final summary is a short table (``print_table``); ``npr ... --json`` prints the JSON instead.
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Literal, TextIO

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

MODE_ENV = "NPR_PROGRESS"
Mode = Literal["tty", "plain", "off"]
Level = Literal["step", "detail"]
# a plain-mode line each time the task crosses another 1/PLAIN_MILESTONES of its total
PLAIN_MILESTONES = 10


def _stream() -> TextIO:
    return sys.stderr


def progress_mode(stream: TextIO | None = None) -> Mode:
    """``tty`` when the stream is an interactive terminal (rich decides), else ``plain``; the env wins."""
    forced = os.environ.get(MODE_ENV, "").strip().lower()
    if forced in ("tty", "plain", "off"):
        return forced  # type: ignore[return-value]

    console = Console(file=stream or _stream())
    return "tty" if console.is_terminal and not console.is_dumb_terminal else "plain"


def _fmt_s(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.1f} s"


class Task:
    """What a loop reports through: ``advance(n, **fields)``; ``fields`` (e.g. ``loss=0.41``) are shown."""

    def __init__(
        self, description: str, total: float | None, unit: str, level: Level, mode: Mode, eta: bool = True
    ) -> None:
        self.description, self.total, self.unit, self.level, self.mode = description, total, unit, level, mode
        self.eta = eta
        self.completed = 0.0
        self.fields: dict[str, Any] = {}
        self.started = time.perf_counter()
        self._next_milestone = 1
        self._bar: Any = None
        self._bar_task: Any = None
        self._stream = _stream()

    # plain mode -----------------------------------------------------------------------------------
    @property
    def _plain(self) -> bool:
        return self.mode == "plain" and self.level == "step"

    def _line(self, text: str) -> None:
        self._stream.write(text + "\n")
        self._stream.flush()

    def _status(self) -> str:
        elapsed = time.perf_counter() - self.started
        done = f"{self.completed:g}" + (f"/{self.total:g}" if self.total else "")
        parts = [f"{self.description}: {done} {self.unit}"]
        if self.total:
            parts[0] += f" ({100 * self.completed / self.total:.0f}%)"
        parts.append(_fmt_s(elapsed))
        if self.eta and self.total and 0 < self.completed < self.total:
            parts.append(f"~{_fmt_s(elapsed * (self.total - self.completed) / self.completed)} left")
        parts += [f"{k} {v}" for k, v in self.fields.items()]
        return ", ".join(parts)

    # ---------------------------------------------------------------------------------------------
    def advance(self, n: float = 1, description: str | None = None, **fields: Any) -> None:
        self.completed += n
        self.update(description, **fields)

    def update(self, description: str | None = None, **fields: Any) -> None:
        if description is not None:
            self.description = description
        self.fields.update({k: _short(v) for k, v in fields.items()})
        if self._bar is not None:
            self._bar.update(
                self._bar_task,
                completed=self.completed,
                description=self.description,
                info=", ".join(f"{k} {v}" for k, v in self.fields.items()),
            )
        elif self._plain and self.total:
            reached = math.floor(PLAIN_MILESTONES * self.completed / self.total)
            if reached >= self._next_milestone and self.completed < self.total:
                self._next_milestone = reached + 1
                self._line(self._status())


def _short(value: Any) -> Any:
    return f"{value:.4g}" if isinstance(value, float) else value


@contextmanager
def track(
    description: str, total: float | None = None, unit: str = "steps", level: Level = "step", eta: bool = True
) -> Iterator[Task]:
    """A progress task for one long loop (see the module docstring for what each mode shows); ``eta=False``
    for steps of unequal length (a stage's phases), where a time-left estimate would mislead."""
    mode = progress_mode()
    task = Task(description, total, unit, level, mode, eta)
    if mode == "tty":
        columns = [SpinnerColumn(), TextColumn("{task.description}")]
        if total:
            columns += [BarColumn(), MofNCompleteColumn(), *([TimeRemainingColumn()] if eta else [])]
        columns += [TimeElapsedColumn(), TextColumn("{task.fields[info]}")]
        forced = os.environ.get(MODE_ENV, "").strip().lower() == "tty"
        console = Console(file=_stream(), force_terminal=True if forced else None)
        bar = Progress(*columns, console=console, transient=True)
        with bar:
            task._bar, task._bar_task = bar, bar.add_task(description, total=total, info="")
            yield task
        return
    if task._plain:
        task._line(f"{description}: started" + (f" ({total:g} {unit})" if total else ""))
    try:
        yield task
    except BaseException:
        if task._plain:
            task._line(f"{task.description}: failed after {_fmt_s(time.perf_counter() - task.started)}")
        raise
    if task._plain:
        elapsed = _fmt_s(time.perf_counter() - task.started)
        fields = "".join(f", {k} {v}" for k, v in task.fields.items())
        task._line(f"{task.description}: done, {task.completed:g} {unit} in {elapsed}{fields}")


def print_table(
    title: str,
    rows: Mapping[str, Any] | list[Mapping[str, Any]],
    file: TextIO | None = None,
    note: str | None = None,
) -> None:
    """A short table on stdout: ``{metric: value}`` as two columns, or a list of rows with shared keys;
    ``note`` is a line printed under it (e.g. where the full record is)."""
    table = Table(title=title, title_justify="left", show_edge=False)
    if isinstance(rows, Mapping):
        table.add_column("metric")
        table.add_column("value", justify="right")
        for key, value in rows.items():
            table.add_row(str(key), _cell(value))
    else:
        keys: list[str] = []
        for row in rows:
            keys.extend(k for k in row if k not in keys)
        for key in keys:
            table.add_column(
                key, justify="left" if not rows or isinstance(rows[0].get(key), str) else "right"
            )
        for row in rows:
            table.add_row(*(_cell(row.get(k)) for k in keys))
    console = Console(
        file=file or sys.stdout, width=200 if file is None and not sys.stdout.isatty() else None
    )
    console.print(table)
    if note:
        console.print(note, highlight=False, soft_wrap=True)


def _cell(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)
