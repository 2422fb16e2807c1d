"""The math-verify process pool: timeouts that work from any thread, and recovery when a worker dies or hangs.

``(10^{7})!`` is a real math-verify input that runs for minutes (sympy evaluates the factorial); it is the
slow pair throughout.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from components.grading.config import GradingConfig
from components.grading.equivalence import Verdict, answers_equal, grade_many_verdicts
from components.grading.verify_pool import VerifyPool, get_pool

SLOW = ("(10^{7})!", "5")  # (pred, gold)


def test_math_verify_itself_refuses_worker_threads() -> None:
    """Why the pool exists: math-verify's SIGALRM timeout cannot run outside the main thread."""
    from math_verify import parse

    errors: list[BaseException] = []

    def call() -> None:
        try:
            parse("$\\frac{1}{2}$")
        except BaseException as err:
            errors.append(err)

    thread = threading.Thread(target=call)
    thread.start()
    thread.join()
    assert errors and "threaded environment" in str(errors[0])


def test_timeout_from_a_worker_thread(pool_cfg: GradingConfig) -> None:
    cfg = pool_cfg.model_copy(update={"timeout_s": 2.0})
    pairs = [SLOW, ("\\sqrt{8}", "2\\sqrt{2}"), ("(3)/(4)", "\\frac{3}{4}")]
    out: list[list[Verdict]] = []
    thread = threading.Thread(target=lambda: out.append(grade_many_verdicts(pairs, cfg)))
    start = time.perf_counter()
    thread.start()
    thread.join(timeout=60)
    elapsed = time.perf_counter() - start
    assert not thread.is_alive()
    slow, root, ratio = out[0]
    assert slow == Verdict(False, "failed", "timeout after 2s")
    assert root == Verdict(True, "math_verify") and ratio == Verdict(True, "math_verify")
    assert elapsed < 30  # the 2 s deadline held (minutes without it)


def test_concurrent_callers_share_the_pool(pool_cfg: GradingConfig) -> None:
    pairs = [(f"\\sqrt{{{4 * k * k}}}", f"{2 * k}") for k in range(2, 40)]
    with ThreadPoolExecutor(max_workers=4) as threads:
        results = list(threads.map(lambda p: answers_equal(p[0], p[1], pool_cfg), pairs))
    assert results == [True] * len(pairs)


def test_timed_out_verdicts_are_not_cached(pool_cfg: GradingConfig) -> None:
    from components.grading.equivalence import _VERDICT_CACHE

    cfg = pool_cfg.model_copy(update={"timeout_s": 0.5})
    assert grade_many_verdicts([SLOW], cfg)[0].reason is not None
    assert (SLOW[1], SLOW[0]) not in _VERDICT_CACHE


@pytest.mark.slow
def test_worker_crash_replaces_the_pool_and_loses_nothing(pool_cfg: GradingConfig) -> None:
    pool = get_pool(pool_cfg.workers, pool_cfg.pool_start_timeout_s)
    cfg = pool_cfg.model_copy(update={"timeout_s": 60.0})
    replaced_before = pool.stats.replacements
    stop = threading.Event()
    killed: list[int] = []

    def kill_workers() -> None:
        # SIGKILL every worker the pool has while the slow pair runs: each attempt dies with its worker.
        while not stop.is_set():
            for pid in pool.worker_pids():
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                except ProcessLookupError:
                    pass
            time.sleep(0.2)

    killer = threading.Thread(target=kill_workers)
    killer.start()
    try:
        verdict = grade_many_verdicts([SLOW], cfg)[0]
    finally:
        stop.set()
        killer.join()
    assert killed
    assert verdict.equal is False and verdict.method == "failed"
    assert verdict.reason is not None and verdict.reason.startswith("worker crashed")
    assert pool.stats.replacements >= replaced_before + 2  # the attempt and its one retry
    # The pool came back with new workers: the next batch (pairs no cache holds) grades normally.
    after = grade_many_verdicts([("\\sqrt{12}", "2\\sqrt{3}"), ("\\sqrt{13}", "2\\sqrt{3}")], pool_cfg)
    assert after == [Verdict(True, "math_verify"), Verdict(False, "math_verify")]
    assert pool.worker_pids() and not set(pool.worker_pids()) & set(killed)


@pytest.mark.slow
def test_unresponsive_worker_is_killed_and_its_chunk_split(monkeypatch: pytest.MonkeyPatch) -> None:
    """The outer deadline: a chunk that overruns it gets its pool killed and its pairs retried one by one.

    A worker stuck beyond its own SIGALRM deadline (in C code no signal interrupts) looks, from the
    parent, exactly like a worker whose pair has a long deadline but whose outer budget is short; the
    budget is shortened here to produce that state with the real slow input.
    """
    pool = VerifyPool(workers=2, start_timeout_s=60.0)
    try:
        pool.warm()
        pairs = [("5", "\\sqrt{25}"), (SLOW[1], SLOW[0]), ("\\sqrt{8}", "2\\sqrt{2}")]  # (gold, pred)
        # Short outer budget only for jobs holding the slow pair (index 1); the others may need a fresh
        # worker to start, which takes seconds.
        monkeypatch.setattr(
            VerifyPool, "_budget", lambda self, job, timeout_s: 4.0 if 1 in job.indices else 120.0
        )
        results = pool.verify(pairs, timeout_s=120.0, chunk_size=3)
        assert results == [(True, None), (False, "timeout (worker unresponsive)"), (True, None)]
        assert pool.stats.replacements == 2  # the chunk, then the slow pair alone
    finally:
        pool.shutdown()
