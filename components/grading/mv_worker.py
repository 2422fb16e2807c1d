"""What runs inside a grading worker process, for one (gold, pred) pair under one per-pair deadline: a pair
in which either text states a relation is compared as a relation (``relations.relation_equal``); the rest,
and relations that module has no opinion on, go to math-verify, and a pair math-verify calls unequal to the
symbolic fallback (``symbolic.symbolic_equal``).

math-verify's own timeout arms SIGALRM with whole seconds and only works in a main thread; a pool worker
runs tasks in its main thread, so here we arm our own ``setitimer`` deadline (fractional seconds) around
the whole parse+parse+verify of one pair and turn math-verify's timeouts off. The deadline raises a
``BaseException`` so math-verify's broad ``except Exception`` cannot swallow it and grade it "False, no
reason". This module imports nothing heavy at import time: the parent imports it only to name the
functions it submits.
"""

from __future__ import annotations

import logging
import os
import re
import signal
from typing import Any

from components.grading.relations import is_relation, relation_equal
from components.grading.symbolic import symbolic_equal

# An exponent of three digits or more on something other than a number.
_LARGE_EXPONENT = re.compile(r"[)}a-zA-Z]\s*(?:\^|\*\*)\s*[{(]?\s*\d{3,}")
# (equal, reason): reason is None for an ordinary verdict, else why the pair could not be graded.
PairResult = tuple[bool, str | None]


class PairDeadline(BaseException):
    """Raised by the SIGALRM handler when one pair exceeds its time budget."""


def _on_alarm(signum: int, frame: Any) -> None:
    raise PairDeadline()


def init_worker() -> None:
    """Pool initializer: import math-verify once and silence its 'timeout disabled' warning."""
    import math_verify  # noqa: F401  # lazy: math_verify (a warm import, so the first task does not pay for it)
    import sympy.parsing.sympy_parser  # noqa: F401  # lazy: sympy (the symbolic fallback's plain-notation parser)

    logging.getLogger("math_verify").setLevel(logging.ERROR)
    signal.signal(signal.SIGALRM, _on_alarm)


def as_boxed(answer: str) -> str:
    """Give math-verify an unambiguous target: the answer inside ``\\boxed{}``, outer ``$`` removed."""
    text = answer.strip()
    if len(text) >= 2 and text.startswith("$") and text.endswith("$"):
        text = text.strip("$").strip()
    return "\\boxed{" + text + "}"


def verify_pair(gold: str, pred: str, timeout_s: float) -> PairResult:
    """A relation pair by ``relation_equal``; otherwise (or without its opinion) math-verify's
    ``verify(parse(gold), parse(pred))`` (that order: verify is asymmetric), then the symbolic fallback."""
    from math_verify import parse, verify  # lazy: math_verify

    signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout_s)
    try:
        if is_relation(gold) or is_relation(pred):
            # before math-verify, which compares an equation by its right-hand side (`1=1` for `x=1`)
            verdict = relation_equal(gold, pred)
            if verdict is not None:
                return bool(verdict), None
        if _LARGE_EXPONENT.search(gold) or _LARGE_EXPONENT.search(pred):
            # `(x-a)^{6000}`, `(x^4+1)^{399}`: math-verify would expand the power until the deadline; the
            # symbolic fallback evaluates it at points instead
            verdict = symbolic_equal(gold, pred)
            if verdict is not None:
                return bool(verdict), None
        gold_parsed = parse(as_boxed(gold), parsing_timeout=None)
        pred_parsed = parse(as_boxed(pred), parsing_timeout=None)
        equal = bool(verify(gold_parsed, pred_parsed, timeout_seconds=None))
        if not equal:
            # What math-verify misses (plain/CAS notation, identities): only ever turns False into True.
            equal = bool(symbolic_equal(gold, pred))
    except PairDeadline:
        return False, f"timeout after {timeout_s:g}s"
    except Exception as err:  # a parser bug on one odd answer must not fail its whole chunk
        return False, f"error: {type(err).__name__}: {str(err)[:200]}"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    return equal, None


def verify_chunk(pairs: list[tuple[str, str]], timeout_s: float) -> list[PairResult]:
    """``verify_pair`` over (gold, pred) pairs; one task per chunk keeps inter-process traffic small."""
    return [verify_pair(gold, pred, timeout_s) for gold, pred in pairs]


def worker_pid() -> int:
    """The worker's process id (used to wait for the pool to be up, and by the crash-recovery test)."""
    return os.getpid()
