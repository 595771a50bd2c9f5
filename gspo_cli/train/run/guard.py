"""The training guards: what happens after a step whose numbers say something went wrong.

- Non-finite guard: a minibatch whose loss or gradient norm is not finite is not applied (the
  step counts it in `bad_updates`); after `trainer.max_bad_updates` such updates in a row the
  run stops (exit 2), or rolls back when `trainer.on_collapse` is `rollback`.
- Collapse guard: `gspo_cli.collapse.CollapseDetector` watches entropy, reward, the sequence
  ratio and held-out accuracy; `trainer.on_collapse` says whether to warn, stop, or roll back
  to the last good checkpoint (at a lower learning rate, with fresh sampling seeds), at most
  `trainer.max_rollbacks` times in the run.
- A stop names the checkpoint from before the trouble, makes it the one `--resume` starts from,
  and prints the command that resumes at a lower learning rate (`resume_advice`).
- Notices, once each: the first minibatch's new/old ratio is not exactly 1 (nothing has been
  updated yet, so it must be), and every group has had zero advantage for several steps.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from gspo_cli.collapse import CRASH_POINTS, CollapseDetector, CollapseEvent
from gspo_cli.run_folder import RECIPE
from gspo_cli.train.run.signals import resume_command

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
    recomputing_pi_old: bool = False  # `auto` last fell back from the engine's log-probs
    said: set[str] = field(default_factory=set)

    def notices(self, step: int, metrics: dict[str, float]) -> list[str]:
        """Lines worth printing once: an inexact first ratio, a run with no learning signal."""
        lines = self._engine_logprob_notices(step, metrics)
        gap = metrics.get("first_ratio_gap_max", 0.0)
        from_engine = metrics.get("pi_old_from_engine", 0.0) > 0
        if gap > FIRST_RATIO_TOLERANCE and "ratio" not in self.said and not from_engine:
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

    def _engine_logprob_notices(self, step: int, metrics: dict[str, float]) -> list[str]:
        """pi_old from the engine: the first ratio shows the engine-vs-trainer gap (said once);
        under `auto`, each switch between the engine's log-probs and the recompute."""
        lines = []
        if metrics.get("pi_old_from_engine", 0.0) > 0 and "engine_ratio" not in self.said:
            self.said.add("engine_ratio")
            lines.append(
                f"note: pi_old is the rollout engine's log-probs, so the first minibatch's "
                f"new/old ratio differs from 1 by the engine-vs-trainer gap (max |log ratio| "
                f"{metrics.get('first_ratio_gap_max', 0.0):.2e} per token, "
                f"{metrics.get('mismatch_seq_log_ratio_abs_max', 0.0):.2e} per sequence); "
                "expected, not a bug"
            )
        if "engine_gap_seq_max" not in metrics:
            return lines
        gap, limit = metrics["engine_gap_seq_max"], metrics["engine_gap_limit"]
        recomputing = gap > limit
        if recomputing != self.recomputing_pi_old:
            self.recomputing_pi_old = recomputing
            lines.append(
                f"note: step {step}: the engine-vs-trainer sequence log-ratio gap {gap:.2e} "
                f"is above {limit:.2e} (a tenth of log(1 + clip_high)): pi_old is recomputed "
                "and the gap checked every step"
                if recomputing
                else f"note: step {step}: the engine-vs-trainer gap {gap:.2e} is back under "
                f"{limit:.2e}: pi_old is the engine's log-probs again"
            )
        return lines

    def after_step(self, step: int, metrics: dict[str, float], minibatches: int) -> Decision:
        # Both guards see every step: a huge update (lr=1e30) both wrecks the policy and makes
        # the next minibatches non-finite, and either signal may come first.
        events = self._non_finite(step, metrics, minibatches)
        events += self.detector.observe(step, metrics)
        if "heldout_accuracy" in metrics:
            held = self.detector.observe_heldout(step, metrics["heldout_accuracy"])
            events += [held] if held is not None else []
        return self._act(events)

    def failed_update(self, step: int, detail: str) -> Decision:
        """An update that was applied and cannot be taken back (DeepSpeed, non-finite norm)."""
        return self._act([CollapseEvent(step, "non_finite", detail)])

    def _non_finite(
        self, step: int, metrics: dict[str, float], minibatches: int
    ) -> list[CollapseEvent]:
        bad = int(metrics.get("bad_updates", 0))
        trailing = int(metrics.get("bad_updates_trailing", 0))
        self.bad_streak = self.bad_streak + bad if bad == minibatches else trailing
        if self.bad_streak < self.max_bad_updates:
            return []
        detail = (
            f"{self.bad_streak} updates in a row had a non-finite loss or gradient (last at "
            f"step {step}); none was applied"
        )
        return [CollapseEvent(step, "non_finite", detail)]

    def _act(self, events: list[CollapseEvent]) -> Decision:
        if not events:
            return Decision("go", [])
        reason = "; ".join(f"{e.signal.replace('_', ' ')}: {e.detail}" for e in events)
        # A run whose updates keep failing learns nothing: `warn` cannot carry on past that.
        fatal = any(e.signal == "non_finite" for e in events)
        if self.on_collapse == "warn" and not fatal:
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


def resume_advice(run_dir: Path, lr: float, world: int = 1, argv: list[str] | None = None) -> str:
    """The command that resumes a stopped run at the peak learning rate `lr`: the `gspo train`
    command line `argv` (after `gspo`) when there is one, else the run folder's own resolved
    recipe. Either way it resumes on as many processes (a --hostfile it cannot know)."""
    if argv and argv[0] == "train":
        args = _without_lr(argv)
    else:  # called from Python, not the command line
        args = ["train", str(run_dir / RECIPE), "--out", str(run_dir)]
    if world > 1 and not any(a == "--nproc" or a.startswith("--nproc=") for a in args):
        args += ["--nproc", str(world)]  # a launched rank's own argv has no --nproc
    return resume_command([*args, "--set", f"optimizer.lr={lr:.3g}"])


def _without_lr(argv: list[str]) -> list[str]:
    """`argv` less any `--set optimizer.lr=...` (the advice gives a new one)."""
    args: list[str] = []
    for arg in argv:
        if arg.startswith("optimizer.lr=") and args and args[-1] == "--set":
            args.pop()
        elif not arg.startswith("--set=optimizer.lr="):
            args.append(arg)
    return args
