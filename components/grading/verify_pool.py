"""The process pool that runs math-verify: lazy, replaced when a worker dies or hangs, shut down at exit.

Why a process pool: math-verify's timeouts use SIGALRM, which only works in a main thread, and RL reward
code, Prefect tasks and the engine call the grader from worker threads. Pool workers run each task in
their own main thread (``mv_worker`` arms the per-pair deadline there), and the parent enforces a second,
outer deadline per chunk with ``future.result(timeout=...)`` in case a worker stops answering altogether
(stuck in C code that no signal interrupts, or killed).

Recovery, so nothing is lost: a chunk that overruns its outer deadline, or dies with its worker, gets the
pool replaced; the other unfinished chunks are resubmitted to the new pool, and the failed chunk is split
into single pairs. A single pair that fails twice is graded False with the reason.
"""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field

from components.grading import mv_worker
from components.grading.mv_worker import PairResult

# A single pair may be resubmitted once after its worker died (the death may have been another pair's).
MAX_ATTEMPTS = 2


@dataclass
class _Job:
    indices: list[int]
    attempts: int = 0


@dataclass
class PoolStats:
    """Counters for diagnostics and the benchmark."""

    pairs: int = 0
    chunks: int = 0
    replacements: int = 0
    failures: list[str] = field(default_factory=list)


_MAIN_LOCK = threading.Lock()


@contextlib.contextmanager
def main_script_hidden() -> Iterator[None]:
    """Start spawn-context processes without the parent's ``__main__`` script.

    A spawned process first re-runs the parent's main script (as ``__mp_main__``) so that functions defined
    there can be unpickled; a script that calls a flow at its top level, without an
    ``if __name__ == "__main__":`` guard, would start that flow again in every pool worker. The workers need
    nothing from ``__main__`` (their functions live in ``components.grading.mv_worker``), so while they
    start, ``__main__`` shows multiprocessing neither a file nor a module spec to import.
    """
    main = sys.modules.get("__main__")
    if main is None:
        yield
        return
    with _MAIN_LOCK:
        saved = {key: main.__dict__[key] for key in ("__file__", "__spec__") if key in main.__dict__}
        main.__dict__.pop("__file__", None)
        main.__dict__["__spec__"] = None
        try:
            yield
        finally:
            main.__dict__.pop("__spec__", None)
            main.__dict__.update(saved)


class VerifyPool:
    """A spawn-context ``ProcessPoolExecutor`` of ``workers`` math-verify workers, created on first use."""

    def __init__(self, workers: int, start_timeout_s: float) -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.workers = workers
        self.start_timeout_s = start_timeout_s
        self.stats = PoolStats()
        self._executor: ProcessPoolExecutor | None = None
        self._lock = threading.Lock()

    # -- lifecycle -------------------------------------------------------------------------------------
    def _ensure(self) -> ProcessPoolExecutor:
        if self._executor is None:
            # spawn, not fork: forking a parent that holds torch/threads/locks is unsafe, and spawn is what
            # verl's own math-verify wrapper uses.
            executor = ProcessPoolExecutor(
                max_workers=self.workers,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=mv_worker.init_worker,
            )
            # Workers are spawned on submit, one per submit that finds none idle: start all of them now,
            # without the main script (main_script_hidden), so no later submit spawns one.
            with main_script_hidden():
                for _ in range(self.workers):
                    executor.submit(mv_worker.worker_pid)
            self._executor = executor
        return self._executor

    def _kill(self) -> None:
        """Kill the workers (a hung one never returns) and drop the executor; the next use makes a new one."""
        executor, self._executor = self._executor, None
        if executor is None:
            return
        self.stats.replacements += 1
        # The stdlib only gained a public way to kill workers in 3.14 (terminate_workers); before that the
        # process table is the only handle on a worker that ignores its task deadline.
        terminate = getattr(executor, "terminate_workers", None)
        if terminate is not None:
            terminate()
        else:
            for process in list((getattr(executor, "_processes", None) or {}).values()):
                if process.is_alive():
                    process.kill()
        executor.shutdown(wait=False, cancel_futures=True)

    def shutdown(self) -> None:
        """Stop the workers (idempotent)."""
        with self._lock:
            executor, self._executor = self._executor, None
            if executor is not None:
                executor.shutdown(wait=True, cancel_futures=True)

    def worker_pids(self) -> list[int]:
        """Process ids of the live workers (empty before first use)."""
        executor = self._executor
        processes = (getattr(executor, "_processes", None) or {}) if executor is not None else {}
        return [p.pid for p in list(processes.values()) if p.is_alive() and p.pid is not None]

    def warm(self) -> None:
        """Start the workers and wait until one answers (spawn + math-verify import take seconds)."""
        with self._lock:
            self._ensure().submit(mv_worker.worker_pid).result(timeout=self.start_timeout_s)

    # -- work ------------------------------------------------------------------------------------------
    def verify(self, pairs: list[tuple[str, str]], timeout_s: float, chunk_size: int) -> list[PairResult]:
        """math-verify every (gold, pred) pair; results in input order, failures as (False, reason)."""
        results: list[PairResult | None] = [None] * len(pairs)
        if not pairs:
            return []
        queue = [
            _Job(list(range(i, min(i + chunk_size, len(pairs))))) for i in range(0, len(pairs), chunk_size)
        ]
        with self._lock:
            self.stats.pairs += len(pairs)
            while queue:
                queue = self._run_round(queue, pairs, results, timeout_s)
        return [r if r is not None else (False, "not graded") for r in results]

    def _budget(self, job: _Job, timeout_s: float) -> float:
        # Each pair has its own in-worker deadline; the outer one allows all of them plus a worker start.
        return timeout_s * len(job.indices) + self.start_timeout_s

    def _run_round(
        self,
        jobs: list[_Job],
        pairs: list[tuple[str, str]],
        results: list[PairResult | None],
        timeout_s: float,
    ) -> list[_Job]:
        """Submit ``jobs``; collect until one fails; return the jobs still to do (empty when all done)."""
        executor = self._ensure()
        futures: list[tuple[_Job, Future[list[PairResult]]]] = []
        for job in jobs:
            chunk = [pairs[i] for i in job.indices]
            futures.append((job, executor.submit(mv_worker.verify_chunk, chunk, timeout_s)))
            self.stats.chunks += 1
        for position, (job, future) in enumerate(futures):
            try:
                chunk_results = future.result(timeout=self._budget(job, timeout_s))
            except (Exception, mv_worker.PairDeadline) as err:  # timeout, BrokenProcessPool, a worker error
                reason = (
                    "timeout (worker unresponsive)"
                    if isinstance(err, FutureTimeout)
                    else (f"worker crashed ({type(err).__name__})")
                )
                self.stats.failures.append(reason)
                self._kill()
                return self._reschedule(futures[position:], err, reason, results)
            for index, result in zip(job.indices, chunk_results, strict=True):
                results[index] = result
        return []

    def _reschedule(
        self,
        remaining: list[tuple[_Job, Future[list[PairResult]]]],
        err: BaseException,
        reason: str,
        results: list[PairResult | None],
    ) -> list[_Job]:
        """Sort the unfinished jobs after a failure into finished, retried, split and given-up ones."""
        todo: list[_Job] = []
        (failed_job, _), rest = remaining[0], remaining[1:]
        hung = isinstance(err, FutureTimeout)
        for job, future in rest:
            # Results that arrived before the kill are kept; the others were collateral and go again as
            # they were, except after a crash, when any of them may be the culprit: count an attempt.
            if future.done() and not future.cancelled() and future.exception() is None:
                for index, result in zip(job.indices, future.result(), strict=True):
                    results[index] = result
                continue
            todo.append(job if hung else _Job(job.indices, job.attempts + 1))
        failed = _Job(failed_job.indices, failed_job.attempts + 1)
        if len(failed.indices) > 1:
            todo.extend(_Job([i], failed.attempts - 1) for i in failed.indices)
        elif hung or failed.attempts >= MAX_ATTEMPTS:
            results[failed.indices[0]] = (False, reason)
        else:
            todo.append(failed)
        for job in todo:
            if len(job.indices) == 1 and job.attempts >= MAX_ATTEMPTS:
                results[job.indices[0]] = (False, reason)
        return [job for job in todo if not (len(job.indices) == 1 and job.attempts >= MAX_ATTEMPTS)]


_POOL: VerifyPool | None = None
_POOL_LOCK = threading.Lock()


def get_pool(workers: int, start_timeout_s: float) -> VerifyPool:
    """The process-wide pool, made on first use (or remade when the worker count changes)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is not None and _POOL.workers != workers:
            _POOL.shutdown()
            _POOL = None
        if _POOL is None:
            _POOL = VerifyPool(workers, start_timeout_s)
            atexit.register(_POOL.shutdown)
        _POOL.start_timeout_s = start_timeout_s
        return _POOL


def shutdown_pool() -> None:
    """Stop the process-wide pool if one is running."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is not None:
            _POOL.shutdown()
            _POOL = None
