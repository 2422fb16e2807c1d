"""Problem records from plain files: JSON lists, JSON lines and parquet, with the field names datasets use.

For sources that are not ORZ's raw layout (``components.data.orz``): the Parallel-R1 cold-start set
(GSM8K-style ``question`` / ``answer`` / ``response``) and DAPO-17k-style RL problems (``prompt`` as a
string or a chat message list, ``reward_model.ground_truth`` or ``answer``). Reading never drops a record:
one without a usable field gets None there, and the quality gate quarantines it with its reason.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

SUFFIXES = (".json", ".jsonl", ".parquet")
PROBLEM_KEYS = ("problem", "question", "prompt")
ANSWER_KEYS = ("answer", "ground_truth", "final_answer")
# GSM8K answers carry their worked solution, then `#### <final answer>`.
GSM8K_FINAL = "####"
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def first_field(item: Mapping[str, Any], keys: Iterable[str]) -> Any:
    """The value of the first of ``keys`` that ``item`` holds (not None), else None."""
    return next((item[k] for k in keys if item.get(k) is not None), None)


def _plain(value: Any) -> Any:
    """numpy arrays / scalars from parquet as Python values."""
    return value.tolist() if hasattr(value, "tolist") else value


def problem_text(value: Any) -> str | None:
    """A problem as text: a string, or the last user message of a chat list (``[{role, content}]``)."""
    value = _plain(value)
    if isinstance(value, str):
        return value.strip() or None
    if isinstance(value, list):
        users = [m.get("content") for m in value if isinstance(m, Mapping) and m.get("role") == "user"]
        if users and isinstance(users[-1], str):
            return users[-1].strip() or None
    return None


def answer_text(value: Any) -> str | None:
    """The gold answer as text: numbers as written, GSM8K's ``<solution> #### 1,234`` reduced to ``1234``.

    A list (alternative answers) keeps its first element; lists of other things, dicts and booleans give None.
    """
    value = _plain(value)
    if isinstance(value, list):
        value = value[0] if value else None
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float):
        return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)
    if not isinstance(value, str):
        return None
    if GSM8K_FINAL in value:
        value = value.rsplit(GSM8K_FINAL, 1)[1]
    value = value.strip()
    plain = value.replace(",", "")
    return plain if _NUMBER.fullmatch(plain) else (value or None)


def gold_of(item: Mapping[str, Any]) -> str | None:
    """The answer of a record: a top-level answer field, else ``reward_model.ground_truth`` (verl's layout)."""
    answer = answer_text(first_field(item, ANSWER_KEYS))
    if answer is None and isinstance(_plain(item.get("reward_model")), Mapping):
        answer = answer_text(_plain(item["reward_model"]).get("ground_truth"))
    return answer


def data_files(path: Path, what: str) -> list[Path]:
    """The readable files at ``path`` (the file itself, or every one below a directory, sorted)."""
    path = Path(path)
    if path.is_file():
        return [path]
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in SUFFIXES)
        if files:
            return files
        raise FileNotFoundError(f"no {'/'.join('*' + s for s in SUFFIXES)} {what} files under {path}")
    raise FileNotFoundError(
        f"{what} data path {path} does not exist (put the files there, or `npr data fetch`)"
    )


def read_records(file: Path) -> list[Any]:
    """The records of one file, in order; ValueError naming the file (and line) when it cannot be read."""
    file = Path(file)
    if file.suffix == ".parquet":
        import pandas as pd  # lazy: pandas

        return [{k: _plain(v) for k, v in row.items()} for row in pd.read_parquet(file).to_dict("records")]
    text = file.read_text(encoding="utf-8", errors="surrogateescape")
    if file.suffix == ".jsonl":
        out = []
        for n, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise ValueError(f"{file}:{n}: not a JSON line ({err})") from None
        return out
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"{file}: not valid JSON ({err})") from None
    if not isinstance(data, list):
        raise ValueError(f"{file}: top level is {type(data).__name__}, expected a list of records")
    return data


def read_files(path: Path, what: str) -> tuple[list[tuple[str, Any]], list[dict[str, Any]]]:
    """``(origin, record)`` for every record at ``path`` (origin = ``<file>#<index>``), and per-file info."""
    path = Path(path)
    out: list[tuple[str, Any]] = []
    infos: list[dict[str, Any]] = []
    for file in data_files(path, what):
        records = read_records(file)
        name = file.relative_to(path).as_posix() if path.is_dir() else file.name
        out.extend((f"{name}#{i}", rec) for i, rec in enumerate(records))
        digest = hashlib.sha256(file.read_bytes()).hexdigest()
        infos.append({"path": str(file), "sha256": digest, "items": len(records)})
    return out, infos
