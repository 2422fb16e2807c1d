"""Final-answer extraction from a model response, with the strictness of the purpose it serves.

The order follows math-verify's ranking of answer forms, restricted to answers the response states:

1. **explicit final answers**, always read: the last run of complete boxes (``\\boxed``, ``\\fbox``,
   ``\\framebox``; boxes separated only by connectors such as ``,``/``and``/``\\quad``/a label ``q =`` are one
   answer, ``\\boxed{1}`` and ``\\boxed{-2}`` -> ``1, -2``; a union sign between them is kept; the same value
   boxed twice in a run counts once; boxes separated by prose are separate statements and the last one is
   the answer), the
   sentence "The final answer is X" (Minerva's "... I hope it is correct."), and the last complete
   ``<answer>...</answer>`` (the R1-style format; its content is reduced like an answer line, so
   ``<answer>\\boxed{5}</answer>`` is ``5``); the one that ends later wins;
2. the purpose's ``fallbacks`` in order: ``answer_line`` (the last entry of the config's ``labels`` table: a
   label before a colon, ``Final Answer:``, ``Answer:``, ``Réponse :``, ``答案：``, ``Antwort:`` ..., or a
   phrase the answer follows, ``réponse est``, ``答案是``; a bare ``**Final Answer**`` heading, or "the
   answer is ..."), ``last_number`` (the last number anywhere: a
   guess, never an explicit answer, so no shipped profile enables it for rewards or evaluation).

**Thinking blocks** never supply the answer: in a response with ``</think>`` only the text after the last one
is read, and a ``<think>`` that never closes hides everything after it (so in
``<think>I guess \\boxed{B}, no wait</think> Final: \\boxed{C}`` the answer is ``C``, and
``<think>... \\boxed{42}</think> Some other text.`` has none: TRL's ``reasoning_accuracy_reward`` rule).

An answer line is reduced to its value: the box or the math in it ("The largest $n$ is 34." -> ``34``;
two formulas joined by "and" -> both), else the number of a one-number sentence ("3 hours ago" -> ``3``),
else the one amount of money among several numbers ("220 $ within 12 months" -> ``220``).
A percent sign or word right after a box (``$\\boxed{28}$ pct``) belongs to the answer.

**Truncation**: with ``require_complete`` (every shipped purpose), a response whose finish reason is not
``stop`` (``length``, ``kv_budget``...) or that opens a box (or an ``<answer>`` tag) after its last complete
one has no answer: a cut-off response earns no reward and no accuracy whatever its last number.

Every scan is linear: the brace matcher visits only braces and box commands found by a regex without
nested quantifiers, so a 1 MB adversarial response costs one pass. Results are cached per (text, settings,
finish reason) because RL and evaluation grade the same responses several times.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache
from typing import NamedTuple

from components.grading.config import DEFAULT_ANSWER_LABELS, ExtractionConfig

FALLBACKS: tuple[str, ...] = ("answer_line", "last_number")
# Finish reasons of a response that ended on its own (engine and SGLang both say "stop").
COMPLETE_FINISH_REASONS = frozenset({"stop"})
MAX_ANSWER_LINE = 2000

# A box command (not followed by a letter, so `\boxedx` is not one), an escaped brace (skipped) or a brace.
_BOX_OR_BRACE = re.compile(r"\\(?:boxed|fbox|framebox)(?![A-Za-z])|\\[{}]|[{}]")
# "The final answer is X" (Minerva's sentence in lm-eval's minerva_math prompt, "I hope it is correct."
# optional): math-verify ranks it with boxes, the later of the two winning.
_MINERVA = re.compile(r"(?i)\bfinal\s+answer\s+is\b\s*:?\s*([^\n]{1,400})")
_MINERVA_PREFIX = re.compile(r"(?i)^\s*(?:the\s+)?final\s+answer\s+is\s*:?\s*")
_QUOTES = re.compile(r'^(?:\\?["“”])+|(?:\\?["“”])+$')
_HOPE = re.compile(r"(?i)\.?\s*i\s+hope\s+it\s+is\s+correct")
# Answer labels: `Answer:` / `Final Answer:` (markdown emphasis, full-width colon), "the answer is", and a
# label alone at the start of a line or followed directly by math (`**Final Answer**`, `Answer \[ 9 \]`).
_ANSWER_SENTENCES = (
    re.compile(r"(?i)\b(?:final\s+)?answer\s+(?:is|would\s+be|will\s+be)\b\s*:?"),
    re.compile(r"(?im)^[ \t>#*_]*(?:final\s+)?answer(?:\*\*|__)?[ \t]*(?=$|\\\[|\$|\\\()"),
)
# `<answer>...</answer>` (R1-style): the tags, found by one linear scan each.
_ANSWER_OPEN = re.compile(r"<answer>", re.I)
_ANSWER_CLOSE = re.compile(r"</answer>", re.I)
_THINK_OPEN, _THINK_CLOSE = "<think>", "</think>"
_LATIN_START = re.compile(r"^[A-Za-zÀ-ɏ]")


@lru_cache(maxsize=64)
def _label_pattern(labels: tuple[str, ...]) -> re.Pattern[str]:
    """One regex over the label table (longest first, so `final answer:` wins over `answer:`).

    An entry ending with a colon is a label (``Réponse :``, ``答案：``: markdown emphasis around it, a space
    before the colon and a full-width colon are all accepted); any other entry is a phrase the answer
    follows (``réponse est``, ``答案是``). A Latin-script entry must start and end a word (`Antwort`, not
    `Gegenantwort`); a CJK one has no word boundary to respect.
    """
    parts = []
    for entry in sorted({label.strip() for label in labels}, key=len, reverse=True):
        labelled = entry.endswith((":", "："))
        core = entry[:-1].strip() if labelled else entry
        body = r"\s+".join(re.escape(word) for word in core.split())
        start = r"(?<![^\W\d_])" if _LATIN_START.match(core) else ""
        end = r"(?![^\W\d_])" if _LATIN_START.match(core[-1]) else ""
        if labelled:
            parts.append(r"(?:\*\*|__)?" + start + body + end + r"(?:\*\*|__)?\s*[:：](?:\*\*|__)?")
        else:
            parts.append(start + body + end + r"\s*[:：]?")
    return re.compile(r"(?i)(?:" + "|".join(parts) + r")")


# Thousands-separated integers first (so `1,000` is one number), then plain decimals / integers.
_NUMBER = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?|-?\d+(?:\.\d+)?|-?\.\d+")
# A number marked as money: a currency sign (or word) right before or after it.
_AMOUNT = re.compile(
    r"(?:[$€£¥]|\\\$)\s?(?P<a>\d[\d,]*(?:\.\d+)?)(?![\d.,]*\d)"
    r"|(?<![\d.])(?P<b>\d[\d,]*(?:\.\d+)?)\s?(?:[$€£¥]|\\\$|\b(?:dollars?|euros?|yuan|元|美元)\b)"
)
_MATH_SPAN = re.compile(
    r"(?<!\\)\$\$(.+?)(?<!\\)\$\$|\\\[(.+?)\\\]|(?<!\\)\$((?:\\\$|[^$\n])+?)(?<!\\)\$|\\\((.+?)\\\)", re.S
)
# "$x <= 2$ is our answer": the value comes before the label.
_ANSWER_AFTER = re.compile(
    r"(?i)(?<!\\)\$((?:\\\$|[^$\n]){1,200}?)(?<!\\)\$\s*(?:is|as)\s+(?:our|the|my)\s+(?:final\s+)?answer\b"
)
_PERCENT_AFTER = re.compile(r"^\s*(?:\$|\\\)|\\\])?\s*(?:\\?%|percent(?:age)?\b|pct\b)", re.I)
# What may sit between two boxes of one answer once math delimiters, spacing and labels are removed.
_SEPARATOR_NOISE = re.compile(
    r"\$|\\[()\[\]]|\\q?quad(?![A-Za-z])|\\[,;:! ]|~|\\(?:text|textnormal|mbox|mathrm)\b|[{}.:]"
    r"|[A-Za-z](?:_\{?[A-Za-z0-9]+\}?)?\s*=|\\cup(?![A-Za-z])"
)
_CONNECTOR = re.compile(r"(?i),|;|\band\b|\bor\b|\\q?quad|\\cup|&")
_WORD = re.compile(r"[A-Za-z()]+")
_SENTENCE_VERB = re.compile(r"(?i)\s(?:is|are|equals|was)\s")
_WORDY = re.compile(r"[A-Za-z]{2,}")
_UNIT_WORDS = frozenset(
    [
        "percent",
        "percentage",
        "pct",
        "dollars",
        "dollar",
        "cents",
        "cent",
        "euros",
        "units",
        "unit",
        "degrees",
        "degree",
        "cm",
        "m",
        "km",
        "mm",
        "inches",
        "inch",
        "feet",
        "foot",
        "ft",
        "miles",
        "mile",
        "meters",
        "meter",
        "hours",
        "hour",
        "minutes",
        "minute",
        "seconds",
        "second",
        "days",
        "day",
        "years",
        "year",
        "ways",
        "square",
        "cubic",
        "sq",
    ]
)


class Extraction(NamedTuple):
    """An extracted answer, how it was found, and whether the response was cut off.

    ``method``: ``boxed``, ``minerva``, ``answer_tag``, ``answer_line``, ``last_number``; ``truncated`` when a truncated
    response lost its answer to ``require_complete``; None when nothing was found.
    """

    answer: str | None
    method: str | None
    truncated: bool = False


class _Box(NamedTuple):
    start: int  # the backslash of the command
    body_start: int
    body_end: int  # the closing brace
    end: int  # just after the closing brace


def _scan_boxes(text: str) -> tuple[list[_Box], int]:
    """Complete top-level boxes in order, and the start of the last box that never closes (-1 if none)."""
    first = min(
        (i for i in (text.find("\\boxed"), text.find("\\fbox"), text.find("\\framebox")) if i >= 0),
        default=-1,
    )
    if first < 0:
        return [], -1
    boxes: list[_Box] = []
    # Open braces: (box command start or -1, body start). `pending` is a box command awaiting its brace.
    stack: list[tuple[int, int]] = []
    open_boxes = 0
    pending = -1
    pending_end = -1
    for m in _BOX_OR_BRACE.finditer(text, first):
        token = m.group()
        if token[0] == "\\" and len(token) == 2:
            continue  # `\{` / `\}` are literal braces in the answer, not groups
        if token == "{":
            is_box = pending >= 0 and not text[pending_end : m.start()].strip()
            stack.append((pending if is_box else -1, m.end()))
            open_boxes += is_box
            pending = -1
        elif token == "}":
            pending = -1
            if not stack:
                continue  # an unmatched closing brace: ignore it, keep scanning
            box_start, body_start = stack.pop()
            if box_start >= 0:
                open_boxes -= 1
                if open_boxes == 0:  # a box inside a box is part of the outer answer
                    boxes.append(_Box(box_start, body_start, m.start(), m.end()))
        else:
            pending, pending_end = m.start(), m.end()
    unclosed = next((start for start, _ in reversed(stack) if start >= 0), -1)
    if pending >= 0 and unclosed < pending and not text[pending_end:].strip():
        unclosed = pending  # the response ends on a box command: its brace was never written
    return boxes, unclosed


def _joinable(separator: str) -> str | None:
    """How two boxes around ``separator`` join into one answer (", " or " \\cup "), or None if they don't."""
    if len(separator) > 80 or "\n\n" in separator:
        return None
    if not separator.strip():
        return ", "
    words = [w for w in _WORD.findall(_SEPARATOR_NOISE.sub(" ", separator)) if w.lower() not in ("and", "or")]
    if not _CONNECTOR.search(separator) and words:
        return None  # "\boxed{1} no no no \boxed{2}": two separate statements
    if len(words) > 4:
        return None
    return " \\cup " if "\\cup" in separator else ", "


def _box_run(text: str, boxes: Sequence[_Box]) -> tuple[str, int, int] | None:
    """The answer of the last run of joinable boxes: (answer, start, end), or None if no box has content."""
    bodies: list[str] = []
    joins: list[str] = []
    end = boxes[-1].end
    start = boxes[-1].start
    i = len(boxes) - 1
    bodies.append(text[boxes[i].body_start : boxes[i].body_end].strip())
    while i > 0:
        join = _joinable(text[boxes[i - 1].end : boxes[i].start])
        if join is None:
            break
        i -= 1
        bodies.append(text[boxes[i].body_start : boxes[i].body_end].strip())
        joins.append(join)
        start = boxes[i].start
    bodies.reverse()
    joins.reverse()
    kept = [(b, j) for b, j in zip(bodies, ["", *joins], strict=True) if b]
    if not kept:
        return None
    # the same value boxed twice in one run (`\boxed{5} \boxed{5}`) is one answer, not a list of two
    unique: list[tuple[str, str]] = []
    seen: set[str] = set()
    for body, join in kept:
        key = " ".join(body.split())
        if key not in seen:
            seen.add(key)
            unique.append((body, join))
    kept = unique
    answer = kept[0][0] + "".join(j + b for b, j in kept[1:])
    if _PERCENT_AFTER.match(text[end : end + 40]) and "%" not in answer:
        answer += "\\%"
    return answer, start, end


def last_boxed(text: str) -> str | None:
    """Content of the last complete top-level ``\\boxed{...}`` / ``\\fbox{...}`` / ``\\framebox{...}``, or None.

    "Last" is the box whose closing brace comes last, so in ``\\boxed{\\boxed{1}}`` it is the outer one.
    A box whose braces never close (a truncated response) is skipped in favour of an earlier complete one.
    Whitespace between the command and its brace is allowed (``\\boxed {5}``).
    """
    boxes, _ = _scan_boxes(text)
    if not boxes:
        return None
    box = boxes[-1]
    return text[box.body_start : box.body_end]


def _span_content(match: re.Match[str]) -> str:
    return next(g for g in match.groups() if g is not None).strip()


def _value_of_line(value: str) -> str | None:
    """An answer line reduced to its value (see the module docstring)."""
    hope = _HOPE.search(value)
    if hope is not None:
        value = value[: hope.start()]
    value = _MINERVA_PREFIX.sub("", value).strip()
    boxes, _ = _scan_boxes(value)
    if boxes:
        run = _box_run(value, boxes)
        if run is not None:
            return run[0]
    value = _QUOTES.sub("", value.strip()).rstrip(" \t.;,。；，")
    value = _QUOTES.sub("", value).strip()
    if not value:
        return None
    spans = list(_MATH_SPAN.finditer(value))
    if spans:
        outside = _MATH_SPAN.sub(" ", value)
        if (
            len(spans) > 1
            and all(_joinable(value[a.end() : b.start()]) for a, b in zip(spans, spans[1:], strict=False))
            and not _wordy(value[: spans[0].start()])
        ):
            return ", ".join(_span_content(s) for s in spans)
        if len(spans) == 1 and not _wordy(outside):
            answer = _span_content(spans[0])
            return answer + "\\%" if _PERCENT_AFTER.match(value[spans[0].end() :]) else answer
        # A sentence around the math: the value follows its verb ("The largest $n$ is 34").
        verb = None
        for verb in _SENTENCE_VERB.finditer(value):  # noqa: B007 - the last one
            pass
        tail = value[verb.end() :] if verb is not None else value
        tail_spans = list(_MATH_SPAN.finditer(tail))
        if tail_spans:
            last = tail_spans[-1]
            answer = _span_content(last)
            return answer + "\\%" if _PERCENT_AFTER.match(tail[last.end() :]) else answer
        if verb is not None and tail.strip():
            return _value_of_text(tail)
        return _span_content(spans[-1])
    verb = None
    for verb in _SENTENCE_VERB.finditer(" " + value):  # noqa: B007 - the last one
        pass
    tail = (" " + value)[verb.end() :] if verb is not None else value
    return _value_of_text(tail if tail.strip() else value)


def _wordy(text: str) -> bool:
    return any(w.lower() not in _UNIT_WORDS for w in _WORDY.findall(re.sub(r"\\[A-Za-z]+", " ", text)))


def _value_of_text(text: str) -> str | None:
    """Plain text (no math delimiters) reduced to a value: itself unless it is a sentence with one number."""
    text = text.strip().rstrip(" \t.;,。；，").strip()
    if not text:
        return None
    if not _wordy(text):
        return text
    numbers = _NUMBER.findall(text)
    if len(set(numbers)) == 1:
        number = numbers[-1]
        after = text[text.rfind(number) + len(number) :]
        return number + "\\%" if _PERCENT_AFTER.match(after) else number
    # "Janeth will still owe 220 $ within 12 months": of several numbers, the one amount of money is the value
    amounts = {m.group("a") or m.group("b") for m in _AMOUNT.finditer(text)}
    if len(amounts) == 1:
        return amounts.pop().replace(",", "")
    return text


def _after_label(text: str, label_end: int) -> str:
    """The text an answer label introduces: a display formula (may span lines), else the rest of the line,
    else (a label alone on its line) the next non-empty line."""
    # An answer is short: a line of megabytes after a label is not one (and must not cost a quadratic scan).
    rest = text[label_end : label_end + MAX_ANSWER_LINE].lstrip(" \t*_")
    for opener, closer in (("\\[", "\\]"), ("$$", "$$")):
        if rest.startswith(opener):
            close = rest.find(closer, len(opener))
            if close >= 0:
                return rest[: close + len(closer)] + rest[close + len(closer) :].split("\n", 1)[0]
    line, _, tail = rest.partition("\n")
    if line.strip():
        return line
    return next((candidate for candidate in tail.split("\n")[:3] if candidate.strip()), "")


def _answer_line(text: str, labels: tuple[str, ...]) -> tuple[str, int] | None:
    """The value of the last answer label in ``text`` (``labels``, then the English sentences) and where the
    label starts."""
    best: re.Match[str] | None = None
    for pattern in (_label_pattern(labels), *_ANSWER_SENTENCES):
        for match in pattern.finditer(text):
            if best is None or match.start() > best.start():
                best = match
    after = None
    for after in _ANSWER_AFTER.finditer(text):  # noqa: B007 - the last one
        pass
    if after is not None and (best is None or after.start() > best.start()):
        return after.group(1).strip(), after.start()
    if best is None:
        return None
    value = _value_of_line(_after_label(text, best.end()))
    return (value, best.start()) if value else None


def _last_number(text: str) -> str | None:
    last = None
    for last in _NUMBER.finditer(text):  # noqa: B007 - we want the final match
        pass
    return None if last is None else last.group().replace(",", "")


def _tidy(answer: str) -> str:
    """Stray characters a model leaves around an answer: a trailing backslash or `$`, an outer `$...$`."""
    answer = answer.strip()
    while answer.endswith("\\") and not answer.endswith("\\\\"):
        answer = answer[:-1].rstrip()
    if answer.count("$") == 1 and (answer.endswith("$") or answer.startswith("$")):
        answer = answer.strip("$").strip()
    return answer


def _answer_tags(text: str) -> tuple[tuple[int, int, int, int] | None, int]:
    """The last complete ``<answer>...</answer>`` as (open start, content start, content end, close end), and
    the start of an ``<answer>`` opened after it and never closed (-1 if none)."""
    opens = [m.span() for m in _ANSWER_OPEN.finditer(text)]
    if not opens:
        return None, -1
    closes = [m.span() for m in _ANSWER_CLOSE.finditer(text)]
    last_close = closes[-1] if closes else None
    before = [span for span in opens if last_close is not None and span[1] <= last_close[0]]
    after = [span for span in opens if last_close is None or span[0] >= last_close[1]]
    unclosed = after[0][0] if after else -1
    if not before or last_close is None:
        return None, unclosed
    opener = before[-1]
    return (opener[0], opener[1], last_close[0], last_close[1]), unclosed


@lru_cache(maxsize=8192)
def _extract(
    text: str,
    fallbacks: tuple[str, ...],
    require_complete: bool,
    finish_reason: str | None,
    labels: tuple[str, ...] = (),
) -> Extraction:
    for name in fallbacks:
        if name not in FALLBACKS:
            raise ValueError(f"unknown answer fallback {name!r}; known: {', '.join(FALLBACKS)}")
    return _extract_part(_after_thinking(text), fallbacks, require_complete, finish_reason, labels)


def _after_thinking(text: str) -> str:
    """The part of a response that may state its final answer: what follows the last ``</think>``, or, when
    a ``<think>`` opened after it never closes, what precedes that (thinking never supplies the answer)."""
    close = text.rfind(_THINK_CLOSE)
    tail_start = close + len(_THINK_CLOSE) if close >= 0 else 0
    opened = text.find(_THINK_OPEN, tail_start)
    return text[tail_start:opened] if opened >= 0 else text[tail_start:]


def _extract_part(
    text: str,
    fallbacks: tuple[str, ...],
    require_complete: bool,
    finish_reason: str | None,
    labels: tuple[str, ...],
) -> Extraction:
    boxes, unclosed = _scan_boxes(text)
    tag, unclosed_tag = _answer_tags(text)
    if require_complete:
        cut = finish_reason is not None and finish_reason not in COMPLETE_FINISH_REASONS
        if cut or (unclosed >= 0 and (not boxes or unclosed > boxes[-1].start)) or unclosed_tag >= 0:
            return Extraction(None, "truncated", True)
    found: tuple[str, int, str] | None = None  # (answer, end position, method)
    if boxes:
        run = _box_run(text, boxes)
        if run is not None:
            found = (run[0], run[2], "boxed")
    minerva = None
    for minerva in _MINERVA.finditer(text):  # noqa: B007 - the last one
        pass
    if minerva is not None and (found is None or minerva.end() > found[1]):
        value = _value_of_line(minerva.group(1))
        if value:
            found = (value, minerva.end(), "minerva")
    if tag is not None and (found is None or tag[3] > found[1]):
        value = _value_of_line(text[tag[1] : tag[2]].strip()) if text[tag[1] : tag[2]].strip() else None
        if value:
            found = (value, tag[3], "answer_tag")
    if found is not None:
        return Extraction(_tidy(found[0]), found[2])
    for name in fallbacks:
        if name == "answer_line":
            line = _answer_line(text, labels)
            if line is not None:
                return Extraction(_tidy(line[0]), name)
        elif name == "last_number":
            number = _last_number(text)
            if number:
                return Extraction(number, name)
    return Extraction(None, None)


def extract_final(text: str, cfg: ExtractionConfig, finish_reason: str | None = None) -> Extraction:
    """The final answer of ``text`` under the purpose settings ``cfg`` (see the module docstring).

    ``finish_reason`` is the engine's (``stop``, ``length``, ``kv_budget``...); None means unknown, and then
    only an unclosed box marks the response as truncated.
    """
    if not isinstance(text, str):
        raise TypeError(f"extract_answer needs a str response, got {type(text).__name__}")
    return _extract(text, tuple(cfg.fallbacks), cfg.require_complete, finish_reason, tuple(cfg.labels))


def extract_answer_detail(text: str, fallbacks: Sequence[str] = ("answer_line",)) -> Extraction:
    """The final answer of ``text`` with ``fallbacks`` and no completeness check; see ``extract_final``.

    Kept for callers that read answers from text that is not a generation (gold solutions, bare answers).
    """
    if not isinstance(text, str):
        raise TypeError(f"extract_answer needs a str response, got {type(text).__name__}")
    return _extract(text, tuple(fallbacks), False, None, DEFAULT_ANSWER_LABELS)


def extract_answer(text: str, fallbacks: Sequence[str] = ("answer_line",)) -> str | None:
    """The final answer of ``text`` (boxes and Minerva's sentence, then ``fallbacks``), or None."""
    return extract_answer_detail(text, fallbacks).answer
