"""Score completions with the recipe's weighted reward functions, each held to its contract.

Every call is checked (rewards/contract.py): N finite numbers, None only with `none_as`. A
problem, an exception or a timeout ends the run before the step's update, as one line naming
the function: nothing of that step is applied or saved, so `--resume` starts it again.
Users' functions run in a worker process with a deadline of `reward.timeout_s` per completion
(rewards/worker.py); the built-ins bound themselves (the maths verifier with the same
`timeout_s` per answer, the code sandbox with its `time_limit_s` per test).
"""

from __future__ import annotations

import inspect
import math
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, NamedTuple, Protocol

from gspo_cli.core.errors import GspoError
from gspo_cli.rewards.answer_forms import BOXED, EXPECTED_FORM, answered, any_form_correct
from gspo_cli.rewards.binding import ANSWER_COLUMN, BoundReward, RewardServices, bind_reward
from gspo_cli.rewards.context import RewardContext
from gspo_cli.rewards.contract import (
    NoneAs,
    RewardFailure,
    RewardTimeout,
    checked_scores,
    describe_exception,
)
from gspo_cli.rewards.reasoning_gym import task_means
from gspo_cli.rewards.worker import RewardWorker, WorkerFunction
from gspo_cli.sandbox.isolation import allow_weak_isolation, checked_mode


class RewardScores(NamedTuple):
    totals: list[float]  # [N] weighted sums
    correct: list[float]  # [N] 1.0 where the first function scored 1.0 or more
    metrics: dict[str, float]  # reward/<name>/mean per function, over the completions it scored
    # [N] answer forms (rewards/answer_forms.py), when the first function is `math` or `code`:
    # 1.0 where the answer is in its expected form; 1.0 where a maths answer in any form is
    # right. None when not measured (another first function, or no maths verifier).
    answered: list[float] | None = None
    correct_any_form: list[float] | None = None


class RewardFunctionEntry(Protocol):
    """One of `reward.functions` as read here (the recipe's RewardFunctionConfig has this
    shape: the step types it by shape and does not import the recipe)."""

    @property
    def name(self) -> str: ...

    @property
    def weight(self) -> float: ...

    @property
    def options(self) -> dict[str, Any]: ...

    @property
    def none_as(self) -> NoneAs: ...


class SandboxSection(Protocol):
    @property
    def allow_weak_isolation(self) -> bool: ...


class RewardSection(Protocol):
    """The `reward` section as read here (the recipe's RewardConfig has this shape)."""

    @property
    def functions(self) -> Sequence[RewardFunctionEntry]: ...

    @property
    def timeout_s(self) -> float: ...

    @property
    def sandbox(self) -> SandboxSection: ...


class WeightedRewards:
    """Sum of weighted reward functions; `accuracy` is the first function's share of 1.0 scores.

    Options were checked against each function's signature when the recipe loaded; here they
    are bound, with the shared workers (`services`) the caller owns and closes. `close` ends
    the worker process of the users' functions.
    """

    def __init__(self, cfg: RewardSection, services: RewardServices) -> None:
        allow_weak_isolation(cfg.sandbox.allow_weak_isolation)
        if any(f.name == "code" for f in cfg.functions):
            checked_mode()  # no usable sandbox: one line now, not after the model has loaded
        # judges and reward models count into it; a caller without one (the async worker) too
        self.context = services.reward_context or RewardContext()
        services = replace(services, reward_context=self.context)
        try:
            self.functions = [bind_reward(f.name, f.options, services) for f in cfg.functions]
        except ValueError as exc:
            raise GspoError(f"reward: {exc}") from None
        self.weights = [f.weight for f in cfg.functions]
        self.none_as: list[NoneAs] = [f.none_as for f in cfg.functions]
        self.labels = metric_labels(cfg.functions)
        self.timeout_s = cfg.timeout_s
        # The first function's expected answer form; `accuracy` is that function's verdict.
        self.form = EXPECTED_FORM.get(cfg.functions[0].name) if cfg.functions else None
        self.math_pool = services.math_pool
        # in the worker: users' functions, unless handed a shared worker (a pool stays here)
        isolated = [i for i, f in enumerate(self.functions) if _isolated(f)]
        self._slot = {i: slot for slot, i in enumerate(isolated)}
        self._worker = RewardWorker(
            [WorkerFunction(self.functions[i].fn, _source(self.functions[i])) for i in isolated]
        )

    def __call__(
        self,
        completions: list[str],
        rows: list[dict[str, Any]],
        completion_ids: list[list[int]] | None = None,
        truncated: list[bool] | None = None,
    ) -> RewardScores:
        """Totals, correctness and metrics for N completions (one row each); GspoError when a
        function breaks its contract. `truncated[i]`: completion i was cut at the token cap
        (read for the answer in any form only)."""
        n = len(completions)
        totals, correct = [0.0] * n, [0.0] * n
        metrics: dict[str, float] = {}
        for i, weight in enumerate(self.weights):
            scores = self._scores(i, completions, rows, completion_ids)
            totals = [
                t if s is None else t + weight * s for t, s in zip(totals, scores, strict=True)
            ]
            if i == 0:
                correct = [1.0 if s is not None and s >= 1.0 else 0.0 for s in scores]
            scored = [s for s in scores if s is not None]
            if scored:  # a function that skipped every completion has no mean this step
                metrics[f"reward/{self.labels[i]}/mean"] = sum(scored) / len(scored)
            metrics.update(task_means(self.labels[i], scores, rows))  # reasoning-gym's tasks
        metrics.update(self.context.drain())  # judge/parse_failures, judge/errors...
        bad = next((j for j, t in enumerate(totals) if not math.isfinite(t)), None)
        if bad is not None:
            raise GspoError(
                f"reward: the weighted sum overflows at completion {bad} ({totals[bad]})"
            )
        return RewardScores(
            totals, correct, metrics, *self._forms(completions, rows, correct, truncated)
        )

    def _forms(
        self,
        completions: list[str],
        rows: list[dict[str, Any]],
        correct: list[float],
        truncated: list[bool] | None,
    ) -> tuple[list[float] | None, list[float] | None]:
        """(answered, correct in any form) of each completion, as far as they are measured."""
        if self.form is None:
            return None, None
        shown = [1.0 if answered(c, self.form) else 0.0 for c in completions]
        if self.form != BOXED or self.math_pool is None:
            return shown, None
        golds = [str(row.get(ANSWER_COLUMN)) for row in rows]
        strict = [c >= 1.0 for c in correct]
        right = any_form_correct(completions, golds, strict, self.math_pool, truncated)
        return shown, [1.0 if ok else 0.0 for ok in right]

    def _scores(
        self,
        i: int,
        completions: list[str],
        rows: list[dict[str, Any]],
        completion_ids: list[list[int]] | None,
    ) -> list[float | None]:
        reward = self.functions[i]
        try:
            args, kwargs = reward.arguments(completions, rows, completion_ids)
        except ValueError as exc:
            raise GspoError(f"reward: {exc}") from None
        try:
            result = self._call(i, args, kwargs, len(completions))
            return checked_scores(result, len(completions), self.none_as[i])
        except RewardFailure as exc:
            raise GspoError(f"reward {reward.name!r}: {exc}") from None

    def _call(self, i: int, args: list[Any], kwargs: dict[str, Any], n: int) -> Any:
        """The function's raw return; RewardFailure when it raised, hung or died."""
        reward = self.functions[i]
        if i in self._slot:
            deadline = self.timeout_s * max(1, n)

            def still_running(elapsed: float) -> None:  # a long call is never silent
                print(
                    f"reward {self.labels[i]}: still running after {elapsed:.0f} s (limit "
                    f"{self.timeout_s:g} s per completion, {deadline:g} s for this call's {n} "
                    "completions)",
                    file=sys.stderr,
                    flush=True,
                )

            try:
                return self._worker.call(self._slot[i], args, kwargs, deadline, still_running)
            except RewardTimeout as exc:
                raise RewardFailure(
                    f"{exc} (reward.timeout_s {self.timeout_s:g}s x {n} completions); "
                    "its worker was stopped"
                ) from None
        # A built-in raises ValueError for bad input; anything else from it is a bug to show.
        caught = ValueError if reward.builtin else Exception
        try:
            return reward.fn(*args, **kwargs)
        except caught as exc:
            raise RewardFailure(describe_exception(exc, _source(reward))) from None

    def close(self) -> None:
        self._worker.close()


def _isolated(reward: BoundReward) -> bool:
    return not reward.builtin and not reward.signature.services


def _source(reward: BoundReward) -> str | None:
    fn = getattr(reward.fn, "func", reward.fn)  # bound options: a functools.partial
    try:
        return inspect.getsourcefile(fn)
    except (TypeError, OSError):  # a callable object or a C function has no source file
        return None


def metric_labels(functions: Sequence[RewardFunctionEntry]) -> list[str]:
    """The name of each function in metrics (`reward/<label>/mean`): the registered name or the
    function's own, the full import path where two share one, `#2`... for repeats."""
    short = [f.name.replace(":", ".").rsplit(".", 1)[-1] for f in functions]
    counts = Counter(short)
    labels = [s if counts[s] == 1 else f.name for s, f in zip(short, functions, strict=True)]
    seen: Counter[str] = Counter()
    out = []
    for label in labels:
        seen[label] += 1
        out.append(label if seen[label] == 1 else f"{label}#{seen[label]}")
    return out
