"""Collapse detection from a run's own signals, against a rolling baseline.

One detector for the trainer (which acts on it: `trainer.on_collapse`) and for `gspo compare`
(whose stability verdict replays it over metrics.jsonl), so both say the same thing.

Each signal is compared with the median of its last WINDOW finite values (the rolling
baseline), once WARMUP values exist, so slow, healthy drift (entropy falling as the policy
sharpens, reward rising) moves the baseline with it and only sudden breaks fire:

The entropy baseline is the median of earlier steps' `entropy_before` (the policy's entropy on
each step's fresh samples before that step's first update); until WARMUP steps exist it is the
current step's own `entropy_before`, so an update that wrecks the policy in step 1 is caught
in step 1.

- entropy explosion: entropy > ENTROPY_RISE x baseline and > baseline + ENTROPY_RISE_NATS.
  A policy pushed into noise (lr=1000 on the tiny model: 0.17 -> 4.6 nats) jumps by several
  nats within a few steps; a healthy run moves by hundredths.
- entropy collapse: entropy < ENTROPY_FLOOR x baseline. A degenerate policy ("1111...", lr=10)
  drops to ~0 within a few steps; healthy sharpening takes hundreds of steps, and the rolling
  baseline follows it.
- reward crash: the mean of the last CRASH_POINTS rewards < REWARD_KEEP x baseline, at least
  REWARD_DROP below it (absolute, reward units), and more than REWARD_Z standard errors below
  it. The baseline is the median of the WINDOW rewards before those CRASH_POINTS (a collapse's
  first steps do not drag it down). The standard error is the batch reward's own step-to-step
  noise, measured on the run: the robust spread (1.4826 x the median absolute deviation) of
  the rewards kept (the baseline's and the window's earlier ones), over sqrt(CRASH_POINTS).
  That noise is mostly which prompts a step drew: with 8 prompts a step on a task of uneven
  difficulty (smollm2-chain-sum: "20 + 56" beside "57 - 87"), three hard batches in a row
  halve the mean with the policy unchanged; with 64 prompts the same task's mean barely moves.
  A collapse moves the mean by many of its spreads. Before WINDOW rewards exist the spread is
  measured on those there are (from CRASH_POINTS on).
- ratio blow-up: the sequence ratio s_i (GSPO's length-normalised ratio, logged for every
  algorithm) leaves [1 / RATIO_LIMIT, RATIO_LIMIT] on RATIO_POINTS consecutive steps. After a
  few minibatch updates s_i stays within a percent of 1 in a healthy run; a factor of 2 means
  the policy moved far within one rollout batch.
- held-out drop: held-out accuracy < HELDOUT_KEEP x the run's best, HELDOUT_DROP below it, and
  below it at level HELDOUT_ALPHA by a one-sided test that knows the evaluation's size
  (`heldout_drop_p`). With 8 problems, one problem solved and then not (12.5% -> 0%) is noise
  (p = 0.5); with 200 problems, 50% -> 20% is not (p < 1e-9).
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

WINDOW = 10
WARMUP = 5
ENTROPY_RISE, ENTROPY_RISE_NATS = 3.0, 0.5
ENTROPY_FLOOR = 0.1
REWARD_KEEP, REWARD_DROP, CRASH_POINTS = 0.5, 0.15, 3
# Standard errors of the 3-step mean (one-sided p ~ 0.001 per step if Gaussian). Replayed on 22
# recorded runs (benchmarks/guard_replay.py; docs/guards-and-reliability.md): no false alarm
# where the rule without the noise test raised 3; every planted fall to 0 or to a tenth that
# it catches is caught, some one step later.
REWARD_Z = 3.0
MAD_TO_SD = 1.4826  # a normal distribution's sd per median absolute deviation
RATIO_LIMIT, RATIO_POINTS = 2.0, 2
HELDOUT_KEEP, HELDOUT_DROP = 0.5, 0.1
HELDOUT_ALPHA = 0.01  # one-sided level at which a held-out drop is more than evaluation noise


@dataclass(frozen=True)
class HeldoutSize:
    """How big each held-out evaluation is: what its accuracy's noise depends on."""

    problems: int
    samples: int  # per problem


def heldout_drop_p(best: float, current: float, problems: int) -> float:
    """One-sided p-value of "the policy got worse" from accuracy `best` to `current`, each the
    mean of per-problem accuracies over the same `problems` problems: Fisher's exact test on
    problem counts. Samples of one problem are correlated (an easy problem is solved by all of
    them), so the problems, not problems x samples, are the sample size; a per-problem score in
    [0, 1] with mean p varies at most as much as a 0/1 one (p(1 - p)), so counting problems as
    0/1 outcomes overstates the noise. Fractional counts (avg@k) round toward each other.
    Also conservative: pairing (the same problems both times) and Fisher's conditioning are
    ignored, and `best` is the best of several evaluations."""
    n = problems
    high = math.floor(best * n + 1e-9)
    low = math.ceil(current * n - 1e-9)
    if n <= 0 or high <= low:
        return 1.0
    total = high + low  # under H0, which of the 2n problem-evaluations they fell on is random

    def log_comb(a: int, b: int) -> float:
        return math.lgamma(a + 1) - math.lgamma(b + 1) - math.lgamma(a - b + 1)

    denominator = log_comb(2 * n, total)
    tail = (
        math.exp(log_comb(n, x) + log_comb(n, total - x) - denominator)
        for x in range(high, min(n, total) + 1)
    )
    return min(1.0, math.fsum(tail))


def reward_noise(rewards: Iterable[float]) -> float:
    """A step's reward noise, robustly: 1.4826 x the median absolute deviation from the median
    (a normal sd; one broken step among the window does not inflate it as an sd would)."""
    values = list(rewards)
    centre = statistics.median(values)
    return MAD_TO_SD * statistics.median(abs(v - centre) for v in values)


@dataclass(frozen=True)
class CollapseEvent:
    step: int
    signal: str  # entropy_explosion | entropy_collapse | reward_crash | ratio_blowup | heldout_drop
    detail: str


@dataclass
class CollapseDetector:
    """Feed it each step's metrics (and held-out results); it returns what broke, once each."""

    history: dict[str, deque[float]] = field(default_factory=dict)
    recent_rewards: deque[float] = field(default_factory=lambda: deque(maxlen=CRASH_POINTS))
    ratio_streak: int = 0
    best_heldout: float | None = None
    heldout_size: HeldoutSize | None = None  # None: no held-out judgement (noise unknown)

    def reset(self) -> None:
        """Forget everything (after a rollback the run restarts from an earlier state)."""
        self.history.clear()
        self.recent_rewards.clear()
        self.ratio_streak = 0

    def _baseline(self, key: str, warmup: int = WARMUP) -> float | None:
        values = self.history.get(key)
        return statistics.median(values) if values and len(values) >= warmup else None

    def _remember(self, key: str, value: float) -> None:
        # rewards keep the window's earlier steps too: the baseline is the WINDOW before them
        size = WINDOW + CRASH_POINTS - 1 if key == "reward_mean" else WINDOW
        self.history.setdefault(key, deque(maxlen=size)).append(value)

    def observe(self, step: int, metrics: Mapping[str, float]) -> list[CollapseEvent]:
        events = [
            e
            for e in (
                self._entropy(step, metrics.get("entropy"), metrics.get("entropy_before")),
                self._reward(step, metrics.get("reward_mean")),
                self._ratio(step, metrics.get("seq_ratio_min"), metrics.get("seq_ratio_max")),
            )
            if e is not None
        ]
        # Runs logged before `entropy_before` existed fall back to the step's mean entropy.
        before = metrics.get("entropy_before", metrics.get("entropy"))
        for key, value in (("entropy_before", before), ("reward_mean", metrics.get("reward_mean"))):
            if value is not None and math.isfinite(value) and not events:
                self._remember(key, float(value))  # a broken step never becomes the baseline
        return events

    def _entropy(
        self, step: int, value: float | None, before: float | None
    ) -> CollapseEvent | None:
        base = self._baseline("entropy_before")
        if base is None and before is not None and math.isfinite(before):
            base = before  # no history yet: this step's own pre-update entropy
        if value is None or base is None or not math.isfinite(value):
            return None
        if value > ENTROPY_RISE * base and value > base + ENTROPY_RISE_NATS:
            detail = f"entropy {value:.3g} nats against a rolling baseline of {base:.3g}"
            return CollapseEvent(step, "entropy_explosion", detail)
        if base > 0 and value < ENTROPY_FLOOR * base:
            detail = (
                f"entropy {value:.3g} nats, under {ENTROPY_FLOOR:.0%} of its baseline {base:.3g}"
            )
            return CollapseEvent(step, "entropy_collapse", detail)
        return None

    def _reward(self, step: int, value: float | None) -> CollapseEvent | None:
        if value is None or not math.isfinite(value):
            return None
        self.recent_rewards.append(float(value))
        before = list(self.history.get("reward_mean", ()))
        if len(before) < CRASH_POINTS or len(self.recent_rewards) < CRASH_POINTS:
            return None
        # The baseline is the steps before the window (once enough precede it): a collapse's
        # first steps must not drag it down. The noise counts the window's earlier steps too:
        # a run of hard batches widens it, as it should, while a collapse is caught first.
        earlier = before[: -(CRASH_POINTS - 1)]
        base = statistics.median((earlier if len(earlier) >= CRASH_POINTS else before)[-WINDOW:])
        recent = statistics.fmean(self.recent_rewards)
        noise = reward_noise(before)  # one step's spread
        error = noise / math.sqrt(CRASH_POINTS)  # the 3-step mean's
        drop = base - recent
        if recent < REWARD_KEEP * base and drop >= REWARD_DROP and drop > REWARD_Z * error:
            errors = f"{drop / error:.1f} standard errors" if error else "no noise before"
            detail = (
                f"reward {recent:.3f} over {CRASH_POINTS} steps against a baseline of {base:.3f} "
                f"({errors}; a step's reward varies by {noise:.3f})"
            )
            return CollapseEvent(step, "reward_crash", detail)
        return None

    def _ratio(self, step: int, low: float | None, high: float | None) -> CollapseEvent | None:
        if low is None or high is None:
            return None
        outside = not (low >= 1 / RATIO_LIMIT and high <= RATIO_LIMIT)  # NaN counts as outside
        self.ratio_streak = self.ratio_streak + 1 if outside else 0
        if self.ratio_streak == RATIO_POINTS:
            detail = f"sequence ratio in [{low:.3g}, {high:.3g}] for {RATIO_POINTS} steps"
            return CollapseEvent(step, "ratio_blowup", detail)
        return None

    def observe_heldout(self, step: int, accuracy: float) -> CollapseEvent | None:
        best, size = self.best_heldout, self.heldout_size
        self.best_heldout = accuracy if best is None else max(best, accuracy)
        if best is None or size is None:
            return None
        if accuracy >= HELDOUT_KEEP * best or best - accuracy < HELDOUT_DROP:
            return None
        p = heldout_drop_p(best, accuracy, size.problems)
        if p >= HELDOUT_ALPHA:
            return None  # as large as the evaluation's own noise
        detail = (
            f"held-out accuracy {accuracy:.1%} after a best of {best:.1%} ({size.problems} "
            f"problems x {size.samples} samples; one-sided p = {p:.2g} < {HELDOUT_ALPHA:g})"
        )
        return CollapseEvent(step, "heldout_drop", detail)


def replay(
    records: Iterable[Mapping[str, float]],
    heldout: Mapping[int, float] | None = None,
    heldout_size: HeldoutSize | None = None,
) -> list[CollapseEvent]:
    """Every event the detector raises over a finished run's per-step records, by step
    (held-out drops only when the evaluations' size is known)."""
    detector = CollapseDetector(heldout_size=heldout_size)
    events: list[CollapseEvent] = []
    evals = dict(heldout or {})
    if 0 in evals:  # the evaluation before any step: the first reference
        detector.observe_heldout(0, evals[0])
    for record in records:
        step = int(record["step"])
        events += detector.observe(step, record)
        if step in evals and (event := detector.observe_heldout(step, evals[step])) is not None:
            events.append(event)
    return events
