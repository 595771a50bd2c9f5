"""Math reward: the last \\boxed{} answer checked against the reference with Math-Verify.

Math-Verify times out with signals, which only work in a process's main thread, so checks run
in a pool of worker processes, a chunk of answers per task (one task per answer costs more in
pickling and wake-ups than a check: 2 workers were slower than 1 process). A chunk that hangs
past its outer deadline is scored again one answer per task; an answer that still hangs scores
0 and the pool is replaced: a bad answer never stops training.
"""

from __future__ import annotations

import multiprocessing as mp
import os
from concurrent.futures import CancelledError, ProcessPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from gspo_cli.core.workers import kill_pool, pool_worker_init
from gspo_cli.rewards.extract import boxed, last_boxed
from gspo_cli.rewards.registry import REWARDS

# The outer deadline allows Math-Verify's own parse + verify timeouts to fire first, plus a
# slack for a worker process's start.
OUTER_DEADLINE_FACTOR = 3.0
OUTER_DEADLINE_SLACK_S = 5.0
CHUNKS_PER_WORKER = 2  # a few chunks per worker: balanced load, few round trips


def check_answer(completion: str, gold: str, timeout_s: float = 5.0) -> float:
    """1.0 when the last boxed answer of `completion` equals `gold`, else 0.0 (main thread only)."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    answer = last_boxed(completion)
    if answer is None:
        return 0.0
    timeout = max(1, int(timeout_s))
    try:
        gold_parsed = parse(
            f"${gold}$",
            [LatexExtractionConfig(), ExprExtractionConfig()],
            parsing_timeout=timeout,
        )
        pred_parsed = parse(boxed(answer), parsing_timeout=timeout)
        if not gold_parsed or not pred_parsed:
            return 0.0
        return 1.0 if verify(gold_parsed, pred_parsed, timeout_seconds=timeout) else 0.0
    except Exception:  # Math-Verify raises on pathological input; that is a wrong answer.
        return 0.0


def check_answers(pairs: list[tuple[str, str]], timeout_s: float) -> list[float]:
    """`check_answer` over a chunk of (completion, gold) pairs, in one worker task."""
    return [check_answer(completion, gold, timeout_s) for completion, gold in pairs]


class MathVerifierPool:
    """A process pool that scores completions with `check_answer`, surviving hung workers."""

    def __init__(self, num_workers: int = 2, timeout_s: float = 5.0) -> None:
        self.num_workers = num_workers
        self.timeout_s = timeout_s
        self._pool: ProcessPoolExecutor | None = None

    def _executor(self) -> ProcessPoolExecutor:
        if self._pool is None:
            # fork, not spawn: spawn re-imports the caller's __main__ (a script, a notebook,
            # stdin), which breaks in many real set-ups. The children only run sympy-based
            # Math-Verify and never touch torch, whose threads are the usual fork hazard.
            # Workers die with the trainer and leave Ctrl-C to it (gspo_cli/core/workers.py).
            ctx = mp.get_context("fork")
            self._pool = ProcessPoolExecutor(
                self.num_workers,
                mp_context=ctx,
                initializer=pool_worker_init,
                initargs=(os.getpid(),),
            )
        return self._pool

    def score(self, completions: list[str], answers: list[str]) -> list[float]:
        if len(completions) != len(answers):
            raise ValueError(f"{len(completions)} completions but {len(answers)} answers")
        pairs = [(c, str(a)) for c, a in zip(completions, answers, strict=True)]
        scores: list[float | None] = [None] * len(pairs)
        deadline = self.timeout_s * OUTER_DEADLINE_FACTOR + OUTER_DEADLINE_SLACK_S
        self._score_in_chunks(pairs, scores, deadline)
        while None in scores:  # what a hung chunk left: one answer per task finds the culprit
            pending = [i for i, v in enumerate(scores) if v is None]
            futures = {
                i: self._executor().submit(check_answer, *pairs[i], self.timeout_s) for i in pending
            }
            for i in pending:
                try:
                    scores[i] = futures[i].result(timeout=deadline)
                except (FutureTimeout, BrokenProcessPool, CancelledError):
                    # This answer hung (or took its worker down): it scores 0, the pool is
                    # replaced, and the answers still waiting are resubmitted to the new one.
                    scores[i] = 0.0
                    self._restart()
                    break
        return [float(v or 0.0) for v in scores]

    def _score_in_chunks(
        self, pairs: list[tuple[str, str]], scores: list[float | None], deadline: float
    ) -> None:
        """Fill `scores` chunk by chunk; stop at the first chunk that hangs or breaks the pool."""
        size = max(1, -(-len(pairs) // (self.num_workers * CHUNKS_PER_WORKER)))  # ceil
        starts = range(0, len(pairs), size)
        futures = [
            self._executor().submit(check_answers, pairs[s : s + size], self.timeout_s)
            for s in starts
        ]
        for start, future in zip(starts, futures, strict=True):
            try:
                values = future.result(timeout=deadline * size)
            except (FutureTimeout, BrokenProcessPool, CancelledError):
                self._restart()
                return
            scores[start : start + size] = values

    def _restart(self) -> None:
        if self._pool is not None:
            kill_pool(self._pool)  # a hung call ignores shutdown
            self._pool = None

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def __enter__(self) -> MathVerifierPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@REWARDS.register("math")
def math_reward(
    completions: list[str], answer: list[Any], *, math_pool: MathVerifierPool
) -> list[float]:
    """1.0 for each completion whose last \\boxed{} matches its reference `answer`, else 0.0.

    `math_pool` is handed in by the trainer or `gspo eval`, sized from their settings.
    """
    return math_pool.score(completions, [str(a) for a in answer])
