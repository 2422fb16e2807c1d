"""Reading Open-Reasoner-Zero raw training files into problem rows.

ORZ raw schema (57k / 72k / 13k collections; ../shared/data/MANIFEST.md): a JSON list whose items are
``[{"from": "human", "value": Q}, {"from": "assistant", "ground_truth": {"value": A, ...}}]``.
Rows come out as ``{id, problem, answer, source, difficulty: None, origin}``; ``origin`` is
``<file name>#<item index>`` so every quarantined row can be found in its file.

Reading never drops an item: an item of the wrong shape becomes a row with ``problem``/``answer`` set to
None (the quality suite then quarantines it with its reason). A field of the wrong type (a number or a
list as the problem; a NaN, boolean, list or dict as the answer) becomes None too, and the row keeps the
raw value and its type in ``raw_fields`` so the quarantine record shows what was in the file. A finite
number is a usable answer (``27.0`` -> ``"27"``), never a usable problem. A whole file of the wrong schema
(ORZ's eval files, ``{"prompt": ..., "final_answer": ...}``) or a truncated file raises ``OrzFormatError``.

Truncated files: the public 72k copy is cut mid-record. With ``recover_truncated=True`` the complete
items before the cut are kept (decoded one by one with ``json.JSONDecoder.raw_decode``, so no assumption
about indentation) and the cut is recorded (items kept, bytes dropped); otherwise the error says how many
complete items a recovery would keep.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from components.data.problems import content_id
from components.errors import UserError

SOURCE = "orz"


class OrzFormatError(UserError, ValueError):
    """An ORZ file is not in the raw training schema, or is truncated and recovery was not asked for."""


@dataclass(frozen=True)
class OrzFileInfo:
    """What was read from one file (recorded in the sample manifest)."""

    path: str
    sha256: str
    items: int
    truncated: bool
    bytes_total: int
    bytes_dropped: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _decode_text(raw: bytes) -> str:
    # surrogateescape keeps undecodable bytes as lone surrogates instead of failing the whole file; the
    # quality suite quarantines exactly the rows that hold them.
    return raw.decode("utf-8", errors="surrogateescape")


def recover_items(text: str) -> tuple[list[Any], int]:
    """The complete items of a JSON list that may be cut off; returns ``(items, end offset of last item)``.

    Raises OrzFormatError when the text does not start a JSON list or breaks before the cut.
    """
    decoder = json.JSONDecoder()
    pos = len(text) - len(text.lstrip())
    if not text.startswith("[", pos):
        raise OrzFormatError("not a JSON list")
    pos += 1
    items: list[Any] = []
    end = pos
    while True:
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= len(text) or text[pos] == "]":
            return items, end
        try:
            item, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            return items, end
        items.append(item)
        end = pos


def read_orz_file(path: Path, recover_truncated: bool = False) -> tuple[list[Any], OrzFileInfo]:
    """Raw items of one ORZ JSON file plus what was read; see the module docstring for truncation."""
    raw = Path(path).read_bytes()
    text = _decode_text(raw)
    info = dict(path=str(path), sha256=hashlib.sha256(raw).hexdigest(), bytes_total=len(raw))
    try:
        items = json.loads(text)
    except json.JSONDecodeError as err:
        items, end = recover_items(text)
        if not items:
            raise OrzFormatError(
                f"{path}: not valid JSON ({err}) and no complete item before the error"
            ) from None
        dropped = len(text[end:].encode("utf-8", "surrogateescape"))
        if not recover_truncated:
            raise OrzFormatError(
                f"{path}: not valid JSON ({err}); it looks truncated: {len(items)} complete items, then "
                f"{dropped} bytes cut mid-item. Set sample_orz.recover_truncated=true to keep the complete items."
            ) from None
        _check_schema(items, path)
        return items, OrzFileInfo(**info, items=len(items), truncated=True, bytes_dropped=dropped)
    if not isinstance(items, list):
        raise OrzFormatError(f"{path}: top level is {type(items).__name__}, expected a list of ORZ items")
    _check_schema(items, path)
    return items, OrzFileInfo(**info, items=len(items), truncated=False, bytes_dropped=0)


def _check_schema(items: list[Any], path: Path) -> None:
    """Reject whole files of another schema; single malformed items are left to the quality suite."""
    if not items:
        return
    first = items[0]
    if isinstance(first, dict) and ("prompt" in first or "final_answer" in first):
        raise OrzFormatError(
            f"{path}: this is ORZ eval data ({{prompt, final_answer}}), not the training schema"
        )
    shaped = sum(
        isinstance(it, list) and len(it) == 2 and all(isinstance(t, dict) for t in it) for it in items
    )
    if shaped == 0:
        raise OrzFormatError(
            f"{path}: no item looks like [{{from: human, value}}, {{from: assistant, ground_truth}}]"
        )


def json_safe(value: Any) -> Any:
    """``value`` as strict JSON can hold it: non-finite floats as their JSON-extension names."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    return value


def _raw(value: Any) -> dict[str, Any]:
    return {"type": type(value).__name__, "value": json_safe(value)}


def _problem_text(value: Any) -> tuple[str | None, dict[str, Any] | None]:
    """(text, None) for a string; (None, raw) for any other value (None itself is just missing)."""
    if isinstance(value, str):
        return value.strip(), None
    return None, (None if value is None else _raw(value))


def _answer_text(value: Any) -> tuple[str | None, dict[str, Any] | None]:
    """Strings and finite numbers are answers (hand-made files use numbers); NaN, infinities, booleans,
    lists and dicts are not, and come back as raw values."""
    if isinstance(value, str):
        return value.strip(), None
    if value is None:
        return None, None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None, _raw(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return None, _raw(value)
        return (str(int(value)) if value.is_integer() else str(value)), None
    return str(value), None


def normalise_item(item: Any, origin: str, source: str = SOURCE) -> dict[str, Any]:
    """One raw ORZ item as a problem row; fields it lacks are None (quarantined later, never dropped), and
    wrong-typed fields are None with their raw value in ``raw_fields``."""
    problem = answer = None
    raw_fields: dict[str, Any] = {}
    if isinstance(item, list) and len(item) == 2 and all(isinstance(t, dict) for t in item):
        human, assistant = item
        problem, raw_problem = _problem_text(human.get("value"))
        truth = assistant.get("ground_truth")
        answer, raw_answer = _answer_text(truth.get("value")) if isinstance(truth, dict) else (None, None)
        raw_fields.update({k: v for k, v in (("problem", raw_problem), ("answer", raw_answer)) if v})
    row = {
        "id": content_id(problem or "", answer or ""),
        "problem": problem,
        "answer": answer,
        "source": source,
        "difficulty": None,
        "origin": origin,
    }
    if raw_fields:
        row["raw_fields"] = raw_fields
    return row


def orz_files(path: Path) -> list[Path]:
    """The ORZ JSON files at ``path``: the file itself, or every ``*.json`` below a directory (sorted)."""
    path = Path(path)
    if path.is_file():
        return [path]
    if path.is_dir():
        files = sorted(p for p in path.rglob("*.json") if p.is_file())
        if not files:
            raise FileNotFoundError(f"no *.json files under {path}")
        return files
    raise FileNotFoundError(f"ORZ data path {path} does not exist (run `npr data fetch --from DIR`)")


def load_orz_rows(
    path: Path, recover_truncated: bool = False, source: str = SOURCE
) -> tuple[list[dict[str, Any]], list[OrzFileInfo]]:
    """Rows of every ORZ file at ``path`` (file or directory) in file order, plus per-file read info."""
    path = Path(path)
    rows: list[dict[str, Any]] = []
    infos: list[OrzFileInfo] = []
    for file in orz_files(path):
        items, info = read_orz_file(file, recover_truncated)
        name = file.relative_to(path).as_posix() if path.is_dir() else file.name
        rows.extend(normalise_item(item, f"{name}#{i}", source) for i, item in enumerate(items))
        infos.append(info)
    return rows, infos
