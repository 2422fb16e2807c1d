"""Evaluation benchmarks in one schema: ``{id, benchmark, problem, answers: list[str]}``.

Local files follow the layout of ../shared/data/benchmarks (written into ``data/benchmarks`` by
``npr data fetch``); for each benchmark the registry names the file recommended in its MANIFEST.md and the
fields to read. Answers arrive as strings, floats (AMC: ``27.0`` -> ``"27"``) or lists (OlympiadBench,
Minerva, with trailing newlines): all become a list of stripped strings. ``tiny_test`` is the held-out split
of stage `sample_orz`. When a benchmark's local file is missing and the hub is reachable, its hub copy
(if the registry names one) is read with ``datasets.load_dataset``.
"""

from __future__ import annotations

import json
import string
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from components.data.problems import load_problems
from components.env import hub_offline
from components.errors import UserError

Record = dict[str, Any]


class BenchmarkError(UserError, ValueError):
    """A benchmark file is malformed (missing field, empty answer, answer not among the choices)."""


@dataclass(frozen=True)
class HubSource:
    """Where the benchmark lives on the Hugging Face hub (used only when the local file is missing)."""

    repo_id: str
    split: str
    config: str | None = None
    # hub field -> the local file's field, where the hub copy names a field otherwise: fetched rows are
    # written in the local file's layout, so one reader serves both
    renames: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class BenchmarkSpec:
    """One benchmark: its local file (relative to the benchmark dir) and the fields that hold its data."""

    name: str
    relpath: str
    problem_field: str
    answer_field: str
    id_field: str | None = None
    hub: HubSource | None = None
    # Builds (problem, answers) from a raw row; None = read problem_field and answer_field directly.
    formatter: Callable[[Record], tuple[str, list[str]]] | None = None
    # The whole benchmark's number of problems (shared/data/MANIFEST.md's counts), which a full evaluation
    # checks the file against; None = not pinned (no check).
    size: int | None = None


def normalise_answers(value: Any) -> list[str]:
    """An answer as a list of stripped strings: ``27.0`` -> ``["27"]``, ``["5\\n"]`` -> ``["5"]``."""
    if isinstance(value, list | tuple):
        return [a for v in value for a in normalise_answers(v)]
    if isinstance(value, bool) or value is None:
        return []
    if isinstance(value, float):
        return [str(int(value)) if value.is_integer() else repr(value)]
    if isinstance(value, int):
        return [str(value)]
    text = str(value).strip()
    return [text] if text else []


def zebralogic_prompt(row: Record) -> tuple[str, list[str]]:
    """ZebraLogic multiple choice: a ``Puzzle/Question/Choices/Answer:`` prompt, the correct letter as target."""
    choices = list(row["choices"])
    if row["answer"] not in choices:
        raise BenchmarkError(f"zebralogic answer {row['answer']!r} is not among the choices {choices}")
    if len(choices) > len(string.ascii_uppercase):
        raise BenchmarkError(f"zebralogic row has {len(choices)} choices; at most 26 letters")
    listed = "\n".join(f"{string.ascii_uppercase[i]}. {c}" for i, c in enumerate(choices))
    prompt = (
        f"Puzzle:\n{str(row['puzzle']).strip()}\n\nQuestion: {str(row['question']).strip()}\n\n"
        f"Choices:\n{listed}\n\nAnswer:"
    )
    return prompt, [string.ascii_uppercase[choices.index(row["answer"])]]


BENCHMARKS: dict[str, BenchmarkSpec] = {
    spec.name: spec
    for spec in (
        BenchmarkSpec(
            "aime24",
            "rllm_deepscaler/aime.json",
            "problem",
            "answer",
            None,  # problem_number repeats across AIME I and II: the row index is the id
            HubSource("HuggingFaceH4/aime_2024", "train"),
            size=30,
        ),
        BenchmarkSpec(
            "aime25",
            "npr/AIME25/aime25.json",
            "question",
            "answer",
            None,
            HubSource("MathArena/aime_2025", "train", renames=(("problem", "question"),)),
            size=30,
        ),
        BenchmarkSpec(
            "hmmt25",
            "npr/HMMT_Feb_2025/hmmt_feb_2025.json",
            "problem",
            "answer",
            "problem_idx",
            HubSource("MathArena/hmmt_feb_2025", "train"),
            size=30,
        ),
        # the Qwen2.5-Math copy's layout (id, problem, question, answer, url), as the local file
        BenchmarkSpec(
            "amc23", "npr/AMC23/amc23.json", "question", "answer", "id", HubSource("FlippyDora/amc23", "train"), size=40
        ),
        # DeepScaleR's evaluation sets (problem, answer as a list), as the local files; no id on the hub
        BenchmarkSpec(
            "olympiadbench",
            "rllm_deepscaler/olympiad_bench.json",
            "problem",
            "answer",
            "id",
            HubSource("lkevinzc/math-eval", "olympiad_bench"),
            size=675,
        ),
        BenchmarkSpec(
            "minerva",
            "rllm_deepscaler/minerva.json",
            "problem",
            "answer",
            "idx",
            HubSource("lkevinzc/math-eval", "minerva"),
            size=272,
        ),
        BenchmarkSpec(
            "math500",
            "npr/MATH500/math500.json",
            "problem",
            "answer",
            "unique_id",
            HubSource("HuggingFaceH4/MATH-500", "test"),
            size=500,
        ),
        BenchmarkSpec(
            "zebralogic",
            "npr/ZebraLogic/zebra_logic.json",
            "puzzle",
            "answer",
            "id",
            HubSource("WildEval/ZebraLogic", "test", config="mc_mode"),
            formatter=zebralogic_prompt,
            # not pinned: its count (the hub's mc_mode test split) is not verified here
        ),
    )
}
TINY_TEST = "tiny_test"
TINY_VAL = "tiny_val"  # the validation split of sample_orz: what tuning and calibration measure on
SPLIT_BENCHMARKS: dict[str, str] = {TINY_TEST: "test", TINY_VAL: "val"}
BENCHMARK_NAMES: tuple[str, ...] = (*BENCHMARKS, *SPLIT_BENCHMARKS)


def read_rows(path: Path) -> list[Record]:
    """Rows of a benchmark file: a JSON list, or JSON Lines (either extension; some .json files are JSONL)."""
    text = Path(path).read_text(encoding="utf-8")
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        try:
            return [json.loads(line) for line in text.splitlines() if line.strip()]
        except json.JSONDecodeError as err:
            raise BenchmarkError(f"{path}: neither a JSON list nor JSON Lines ({err})") from None
    if isinstance(data, dict):  # a JSON Lines file with a single line
        data = [data]
    if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
        raise BenchmarkError(f"{path}: expected a list of objects")
    return data


def hub_rows(spec: BenchmarkSpec) -> list[Record]:
    """Rows of the benchmark's hub copy (``datasets.load_dataset``; online only)."""
    from datasets import load_dataset  # lazy: datasets

    ds = load_dataset(spec.hub.repo_id, spec.hub.config, split=spec.hub.split)
    renames = dict(spec.hub.renames)
    return [{renames.get(k, k): v for k, v in r.items()} for r in ds]


def to_records(spec: BenchmarkSpec, rows: list[Record]) -> list[Record]:
    """Raw rows as benchmark records; every row must yield a problem and at least one answer."""
    records = []
    for i, row in enumerate(rows):
        try:
            if spec.formatter is not None:
                problem, answers = spec.formatter(row)
            else:
                problem, answers = (
                    str(row[spec.problem_field]).strip(),
                    normalise_answers(row[spec.answer_field]),
                )
        except KeyError as err:
            raise BenchmarkError(f"{spec.name} row {i} has no field {err}; it has {sorted(row)}") from None
        if not problem or not answers:
            raise BenchmarkError(f"{spec.name} row {i}: empty problem or answer")
        native = row.get(spec.id_field) if spec.id_field else None
        records.append(
            {
                "id": f"{spec.name}-{native if native is not None else i}",
                "benchmark": spec.name,
                "problem": problem,
                "answers": answers,
            }
        )
    ids = [r["id"] for r in records]
    if len(set(ids)) != len(ids):
        raise BenchmarkError(f"{spec.name}: duplicate ids in the file")
    return records


# A user's own benchmark file (`npr eval --benchmarks path/to/file.jsonl`): JSON Lines (or a JSON list) of
# objects with a problem and its answer(s); the field names are mapped with --problem-field/--answer-field.
BENCHMARK_FILE_SUFFIXES = (".jsonl", ".json")


@dataclass(frozen=True)
class FieldMap:
    """Which fields of a user's benchmark file hold the problem, the answer(s) and (optionally) the id."""

    problem: str = "problem"
    answer: str = "answer"
    id: str | None = "id"


def is_benchmark_file(name: str) -> bool:
    """Whether a ``--benchmarks`` entry names a file (a path or a .json/.jsonl name), not a registered name."""
    return name.endswith(BENCHMARK_FILE_SUFFIXES) or "/" in name or Path(name).is_file()


def load_benchmark_file(
    path: Path | str, fields: FieldMap = FieldMap(), max_problems: int | None = None
) -> list[Record]:
    """A user's benchmark file as benchmark records, named by the file's stem (``mine.jsonl`` -> ``mine``).

    Same records as a registered benchmark (``{id, benchmark, problem, answers}``, ids ``<name>-<id>`` or the
    row index where a row has no id), so decoding, grading and the report are the same code. A missing,
    non-UTF-8, non-JSON or empty file, or a row without the mapped fields, is a BenchmarkError naming the file.
    """
    path = Path(path)
    if not path.is_file():
        raise BenchmarkError(f"benchmark file {path} does not exist")
    try:
        rows = read_rows(path)
    except UnicodeDecodeError as err:
        raise BenchmarkError(f"{path}: not UTF-8 text (byte offset {err.start})") from None
    if not rows:
        raise BenchmarkError(f"{path}: no rows")
    bad = next((i for i, row in enumerate(rows) if not isinstance(row, dict)), None)
    if bad is not None:
        raise BenchmarkError(f"{path}: row {bad} is not a JSON object")
    spec = BenchmarkSpec(path.stem, str(path), fields.problem, fields.answer, fields.id)
    try:
        records = to_records(spec, rows)
    except BenchmarkError as err:
        hint = " (map the fields with --problem-field/--answer-field)" if "has no field" in str(err) else ""
        raise BenchmarkError(f"{path}: {err}{hint}") from None
    return records[:max_problems] if max_problems else records


def load_benchmark(
    name: str,
    benchmark_dir: Path | str,
    max_problems: int | None = None,
    problems_dir: Path | str | None = None,
    full: bool = False,
) -> list[Record]:
    """The first ``max_problems`` problems of benchmark ``name`` (all when None), in file order.

    ``full``: the evaluation reports the whole benchmark (not a smoke sample), so a file that does not hold
    the benchmark's pinned number of problems (``BenchmarkSpec.size``: the committed ``data/`` is a
    few-problem smoke set) is refused with a BenchmarkError saying what to do, whatever ``max_problems``.

    ``benchmark_dir`` is the local benchmarks directory (``data/benchmarks``); ``problems_dir`` is the
    `sample_orz` problems directory, needed only for ``tiny_test`` (its test split) and ``tiny_val`` (its
    validation split). Raises KeyError for an unknown name, FileNotFoundError when the file is missing and
    no hub copy can be read, BenchmarkError on bad rows.
    """
    if name in SPLIT_BENCHMARKS:
        split = SPLIT_BENCHMARKS[name]
        if problems_dir is None:
            raise ValueError(f"{name} is the {split} split of sample_orz: pass problems_dir")
        rows = load_problems(problems_dir, split)  # type: ignore[arg-type]
        if not rows:
            size = "test_n" if split == "test" else "val_n"
            raise BenchmarkError(f"{problems_dir} has an empty {split} split (sample_orz.{size} = 0)")
        records = [
            {"id": r["id"], "benchmark": name, "problem": r["problem"], "answers": [r["answer"]]}
            for r in rows
        ]
        return records[:max_problems] if max_problems else records
    if name not in BENCHMARKS:
        raise KeyError(f"unknown benchmark {name!r}; known: {', '.join(BENCHMARK_NAMES)}")
    spec = BENCHMARKS[name]
    path = Path(benchmark_dir) / spec.relpath
    if path.exists():
        rows, source = read_rows(path), str(path)
    elif spec.hub is not None and not hub_offline():
        rows, source = hub_rows(spec), spec.hub.repo_id
    else:
        where = "" if spec.hub is None else f" and the hub copy {spec.hub.repo_id} is unreachable (offline)"
        raise FileNotFoundError(
            f"benchmark {name}: {path} does not exist{where}; run `npr data fetch [--from DIR]`"
        )
    if full and spec.size is not None and len(rows) != spec.size:
        raise BenchmarkError(
            f"benchmark {name}: {source} holds "
            f"{len(rows)} problems, the whole benchmark has {spec.size}. The committed data/ is a smoke set: "
            "fetch the full files (`npr data fetch --from DIR`), or mark the benchmark `smoke: true` in "
            "evaluate.benchmarks (reported apart, never as the benchmark's score)"
        )
    if max_problems is not None:
        rows = rows[:max_problems]
    return to_records(spec, rows)
