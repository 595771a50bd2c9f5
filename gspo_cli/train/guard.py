"""The training guards: what happens after a step whose numbers say something went wrong.

- Non-finite guard: a minibatch whose loss or gradient norm is not finite is not applied (the
  step counts it in `bad_updates`); after `trainer.max_bad_updates` such updates in a row the
  run stops (exit 2), naming the last good checkpoint.
- Collapse guard: `gspo_cli.collapse.CollapseDetector` watches entropy, reward, the sequence
  ratio and held-out accuracy; `trainer.on_collapse` says whether to warn, stop, or roll back
  to the last good checkpoint (optionally at a lower learning rate, with fresh sampling seeds),
  at most `trainer.max_rollbacks` times.
- Notices, once each: the first minibatch's new/old ratio is not exactly 1 (nothing has been
  updated yet, so it must be), and every group has had zero advantage for several steps.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gspo_cli.collapse import CRASH_POINTS, CollapseDetector, CollapseEvent

FIRST_RATIO_TOLERANCE = 1e-5  # max |log ratio| float noise allowed between identical forwards
ZERO_SIGNAL_STEPS = 3  # steps in a row with no learning signal before saying so


@dataclass(frozen=True)
class Decision:
    action: str  # go | warn | stop | rollback
    events: list[CollapseEvent]
    reason: str = ""


@dataclass
class Guard:
    max_bad_updates: int
    on_collapse: str
    max_rollbacks: int
    detector: CollapseDetector = field(default_factory=CollapseDetector)
    bad_streak: int = 0
    rollbacks: int = 0
    zero_signal_streak: int = 0
    said: set[str] = field(default_factory=set)

    def notices(self, step: int, metrics: dict[str, float]) -> list[str]:
        """Lines worth printing once: an inexact first ratio, a run with no learning signal."""
        lines = []
        gap = metrics.get("first_ratio_gap_max", 0.0)
        if gap > FIRST_RATIO_TOLERANCE and "ratio" not in self.said:
            self.said.add("ratio")
            lines.append(
                f"note: at step {step} the first minibatch's new/old ratio is not exactly 1 "
                f"before any update (max |log ratio| {gap:.2e}); likely causes: sampling "
                "processors, dropout, batch-variant kernels, or an engine mismatch"
            )
        no_signal = metrics.get("zero_adv_group_frac", 0.0) >= 1.0
        self.zero_signal_streak = self.zero_signal_streak + 1 if no_signal else 0
        if self.zero_signal_streak == ZERO_SIGNAL_STEPS:
            lines.append(
                f"warning: steps {step - ZERO_SIGNAL_STEPS + 1}-{step}: every group had zero "
                "advantage (all samples scored alike), so nothing is learned; check the reward, "
                "the task difficulty or rollout.group_size"
            )
        return lines

    def after_step(self, step: int, metrics: dict[str, float], minibatches: int) -> Decision:
        bad = int(metrics.get("bad_updates", 0))
        trailing = int(metrics.get("bad_updates_trailing", 0))
        self.bad_streak = self.bad_streak + bad if bad == minibatches else trailing
        if self.bad_streak >= self.max_bad_updates:
            reason = (
                f"{self.bad_streak} updates in a row had a non-finite loss or gradient (last at "
                f"step {step}); none was applied"
            )
            event = CollapseEvent(step, "non_finite", reason)
            return Decision("stop", [event], reason)
        events = self.detector.observe(step, metrics)
        if "heldout_accuracy" in metrics:
            held = self.detector.observe_heldout(step, metrics["heldout_accuracy"])
            events += [held] if held is not None else []
        return self._act(events)

    def _act(self, events: list[CollapseEvent]) -> Decision:
        if not events:
            return Decision("go", [])
        reason = "; ".join(f"{e.signal.replace('_', ' ')}: {e.detail}" for e in events)
        if self.on_collapse == "warn":
            return Decision("warn", events, reason)
        if self.on_collapse == "rollback" and self.rollbacks < self.max_rollbacks:
            self.rollbacks += 1
            return Decision("rollback", events, reason)
        return Decision("stop", events, reason)

    def restarted(self) -> None:
        """After a rollback: the detector's baselines belong to the abandoned steps."""
        self.detector.reset()
        self.bad_streak = 0


def rollback_target(step: int) -> int:
    """Roll back to a checkpoint at least this old: a collapse is detected up to
    CRASH_POINTS steps after it began (step 0 is the starting policy)."""
    return max(0, step - CRASH_POINTS)
