"""Final-answer extraction from a model response.

The answer is the content of the last complete ``\\boxed{...}`` (or ``\\fbox{...}``), nested braces
balanced. When there is none, the configured fallbacks are tried in order:

- ``answer_line``: the text after the last ``Answer:`` / ``Final Answer:`` label (markdown bold allowed),
  with the Minerva phrasing "The final answer is X. I hope it is correct." reduced to X;
- ``last_number``: the last number in the text (thousands separators dropped).

Every scan is linear: the brace matcher visits only braces and box commands found by a regex without
nested quantifiers, so a 1 MB adversarial response costs one pass. Results are cached per (text,
fallbacks) because RL and evaluation grade the same responses several times (reward, metrics, records).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache
from typing import Literal, NamedTuple

Fallback = Literal["answer_line", "last_number"]
FALLBACKS: tuple[str, ...] = ("answer_line", "last_number")

# A box command (not followed by a letter, so `\boxedx` is not one) or a brace. No nested quantifiers.
_BOX_OR_BRACE = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])|[{}]")
# `Answer:` / `Final Answer:` with optional markdown emphasis around the label; the colon may be full-width.
_ANSWER_LABEL = re.compile(r"(?i)(?:\*\*|__)?(?:final\s+)?answer(?:\*\*|__)?\s*[:：](?:\*\*|__)?")
_MINERVA_PREFIX = re.compile(r"(?i)^\s*the\s+final\s+answer\s+is\s*")
_MINERVA_SUFFIX = re.compile(r"(?i)\.?\s*i\s+hope\s+it\s+is\s+correct\.?\s*$")
# Thousands-separated integers first (so `1,000` is one number), then plain decimals / integers.
_NUMBER = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?|-?\d+(?:\.\d+)?|-?\.\d+")


class Extraction(NamedTuple):
    """An extracted answer and how it was found (``boxed``, ``answer_line``, ``last_number``)."""

    answer: str | None
    method: str | None


def last_boxed(text: str) -> str | None:
    """Content of the last complete ``\\boxed{...}`` / ``\\fbox{...}``, or None.

    "Last" is the box whose closing brace comes last, so in ``\\boxed{\\boxed{1}}`` it is the outer one.
    A box whose braces never close (a truncated response) is skipped in favour of an earlier complete one.
    Whitespace between the command and its brace is allowed (``\\boxed {5}``).
    """
    starts_at = [i for i in (text.find("\\boxed"), text.find("\\fbox")) if i >= 0]
    if not starts_at:
        return None
    found: tuple[int, int] | None = None
    # Each open brace records whether it opened a box; `pending_box` is the end of a box command whose
    # brace has not been seen yet (only whitespace may sit between them).
    stack: list[bool] = []
    starts: list[int] = []
    pending_box = -1
    # Braces before the first box command cannot change which brace closes a box: start there.
    for m in _BOX_OR_BRACE.finditer(text, min(starts_at)):
        token = m.group()
        if token == "{":
            is_box = pending_box >= 0 and text[pending_box : m.start()].strip() == ""
            stack.append(is_box)
            starts.append(m.end())
            pending_box = -1
        elif token == "}":
            pending_box = -1
            if not stack:
                continue  # an unmatched closing brace: ignore it, keep scanning
            was_box = stack.pop()
            begin = starts.pop()
            if was_box:
                found = (begin, m.start())
        else:
            pending_box = m.end()
    if found is None:
        return None
    return text[found[0] : found[1]]


def _after_last_answer_label(text: str) -> str | None:
    last = None
    for last in _ANSWER_LABEL.finditer(text):  # noqa: B007 - we want the final match
        pass
    if last is None:
        return None
    rest = text[last.end() :]
    line, _, tail = rest.partition("\n")
    if not line.strip():
        # "Final Answer:\n42": the answer is on the next non-empty line.
        line = next((candidate for candidate in tail.split("\n") if candidate.strip()), "")
    answer = _MINERVA_SUFFIX.sub("", _MINERVA_PREFIX.sub("", line)).strip()
    inner = last_boxed(answer)
    if inner is not None:
        return inner.strip() or None
    # `$\frac{3}{4}$.` -> `\frac{3}{4}`: sentence stop outside the math, then the delimiters, then a stop
    # inside them (a leading `.` is kept: `.5` is a number).
    answer = answer.rstrip(" \t.").strip("$ \t").rstrip(" \t.")
    return answer or None


def _last_number(text: str) -> str | None:
    last = None
    for last in _NUMBER.finditer(text):  # noqa: B007 - we want the final match
        pass
    return None if last is None else last.group().replace(",", "")


@lru_cache(maxsize=8192)
def _extract(text: str, fallbacks: tuple[str, ...]) -> Extraction:
    boxed = last_boxed(text)
    if boxed is not None and boxed.strip():
        return Extraction(boxed.strip(), "boxed")
    for name in fallbacks:
        if name == "answer_line":
            found = _after_last_answer_label(text)
        elif name == "last_number":
            found = _last_number(text)
        else:
            raise ValueError(f"unknown answer fallback {name!r}; known: {', '.join(FALLBACKS)}")
        if found:
            return Extraction(found, name)
    return Extraction(None, None)


def extract_answer_detail(text: str, fallbacks: Sequence[str] = FALLBACKS) -> Extraction:
    """The final answer of ``text`` and the method that found it; ``Extraction(None, None)`` if none.

    ``fallbacks`` (in order) are tried only when there is no non-empty box; see the module docstring.
    """
    if not isinstance(text, str):
        raise TypeError(f"extract_answer needs a str response, got {type(text).__name__}")
    return _extract(text, tuple(fallbacks))


def extract_answer(text: str, fallbacks: Sequence[str] = FALLBACKS) -> str | None:
    """The final answer of ``text`` (last ``\\boxed{}``, then the fallbacks), or None if there is none."""
    return extract_answer_detail(text, fallbacks).answer
