"""The training guards: what happens after a step whose numbers say something went wrong.

- Non-finite guard: a minibatch whose loss or gradient norm is not finite is not applied (the
  step counts it in `bad_updates`); after `trainer.max_bad_updates` such updates in a row the
  run stops (exit 2), or rolls back when `trainer.on_collapse` is `rollback`.
- Collapse guard: `gspo_cli.runs.collapse.CollapseDetector` watches entropy, reward, the sequence
  ratio and held-out accuracy; `trainer.on_collapse` says whether to warn, stop, or roll back
  to the last good checkpoint (at a lower learning rate, with fresh sampling seeds), at most
  `trainer.max_rollbacks` times in the run.
- A stop names the checkpoint from before the trouble, makes it the one `--resume` starts from,
  and prints the command that resumes with the setting the run's own metrics point at
  (`Guard.remedy`, `resume_advice`): the entropy bonus when entropy rose with
  `algorithm.entropy_coef` > 0, the KL penalty when the KL to the reference grew with
  `algorithm.kl_coef` > 0, else (ratio or gradient-norm blow-up, ...) the learning rate.
- Notices, once each: the first minibatch's new/old ratio is not exactly 1 (nothing has been
  updated yet, so it must be), and every group has had zero advantage for several steps.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from gspo_cli.rewards.judges.reward import parse_failure_share
from gspo_cli.runs.collapse import CRASH_POINTS, CollapseDetector, CollapseEvent
from gspo_cli.runs.folder import RECIPE
from gspo_cli.train.run.signals import resume_command

FIRST_RATIO_TOLERANCE = 1e-5  # max |log ratio| float noise allowed between identical forwards
ZERO_SIGNAL_STEPS = 3  # steps in a row with no learning signal (or judge) before saying so
JUDGE_UNPARSED_SHARE = 0.5  # a judge whose replies mostly do not parse scores nothing itself
# What the advice compares: each metric's median over the first EARLY_POINTS steps (since the
# start or a rollback) against the step that stopped the run.
EARLY_POINTS = 3
ENTROPY_BONUS_RISE = 1.5  # entropy up by this factor with the entropy bonus on: the bonus
KL_RISE, KL_LARGE = 2.0, 0.1  # KL (nats per token) doubled and this large with kl_coef on
GRAD_RISE = 10.0  # gradient norm up by this factor: the updates are too large
KL_COEF_RAISE = 2.0  # the advice's stronger KL penalty


@dataclass(frozen=True)
class Remedy:
    """What to change on resume and why (from the run's metrics). `value` None: the learning
    rate, which the loop computes (rollbacks included)."""

    key: str  # optimizer.lr | algorithm.entropy_coef | algorithm.kl_coef
    why: str
    value: float | None = None


@dataclass(frozen=True)
class Decision:
    action: str  # go | warn | stop | rollback
    events: list[CollapseEvent]
    reason: str = ""
    remedy: Remedy | None = None  # set on stop


@dataclass
class Guard:
    max_bad_updates: int
    on_collapse: str
    max_rollbacks: int
    detector: CollapseDetector = field(default_factory=CollapseDetector)
    bad_streak: int = 0
    rollbacks: int = 0
    zero_signal_streak: int = 0
    judge_unparsed_streak: int = 0
    recomputing_pi_old: bool = False  # `auto` last fell back from the engine's log-probs
    said: set[str] = field(default_factory=set)
    entropy_coef: float = 0.0  # algorithm.entropy_coef and kl_coef: causes the advice may name
    kl_coef: float = 0.0
    early: dict[str, list[float]] = field(default_factory=dict)  # first EARLY_POINTS values
    last: dict[str, float] = field(default_factory=dict)  # the latest step's values

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
        lines += self._judge_notice(step, metrics)
        no_signal = metrics.get("zero_adv_group_frac", 0.0) >= 1.0
        self.zero_signal_streak = self.zero_signal_streak + 1 if no_signal else 0
        if self.zero_signal_streak == ZERO_SIGNAL_STEPS:
            lines.append(
                f"warning: steps {step - ZERO_SIGNAL_STEPS + 1}-{step}: every group had zero "
                "advantage (all samples scored alike), so nothing is learned; check the reward, "
                "the task difficulty or rollout.group_size"
            )
        return lines

    def _judge_notice(self, step: int, metrics: dict[str, float]) -> list[str]:
        """Once: most of the judge's replies did not parse for several steps in a row."""
        share = parse_failure_share(metrics)
        unparsed = share is not None and share > JUDGE_UNPARSED_SHARE
        self.judge_unparsed_streak = self.judge_unparsed_streak + 1 if unparsed else 0
        if self.judge_unparsed_streak != ZERO_SIGNAL_STEPS or "judge" in self.said:
            return []
        self.said.add("judge")
        return [
            f"warning: steps {step - ZERO_SIGNAL_STEPS + 1}-{step}: more than "
            f"{JUDGE_UNPARSED_SHARE:.0%} of the judge's replies did not parse ({share:.0%} at "
            f"step {step}), so those rewards are on_parse_failure's, not the judge's; check "
            "the judge's parse rule and template against its replies (docs/judges.md)"
        ]

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
        self._track(metrics)
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
        return Decision("stop", events, reason, self.remedy(events))

    def restarted(self) -> None:
        """After a rollback: the detector's baselines belong to the abandoned steps."""
        self.detector.reset()
        self.bad_streak = 0
        self.early.clear()
        self.last.clear()

    def _track(self, metrics: dict[str, float]) -> None:
        for key in ("entropy", "kl", "grad_norm"):
            value = metrics.get(key)
            if value is None or not math.isfinite(value):
                continue
            self.last[key] = float(value)
            early = self.early.setdefault(key, [])
            if len(early) < EARLY_POINTS:
                early.append(float(value))

    def _trend(self, key: str) -> tuple[float, float] | None:
        """(early median, latest) of a tracked metric, None when it was never logged."""
        if key not in self.last:
            return None
        return statistics.median(self.early[key]), self.last[key]

    def remedy(self, events: list[CollapseEvent]) -> Remedy:
        """The setting the run's metrics point at. Non-finite updates and blow-ups of the
        ratio or gradient norm are too-large steps; entropy rising under an entropy bonus is
        the bonus; KL to the reference growing under a KL penalty is a penalty too weak."""
        signals = {e.signal for e in events}
        if "non_finite" not in signals:  # a non-finite update is a step size, whatever else
            found = self._entropy_bonus(signals) or self._kl_penalty()
            if found is not None:
                return found
        return Remedy("optimizer.lr", self._step_size_cause(signals))

    def _entropy_bonus(self, signals: set[str]) -> Remedy | None:
        entropy = self._trend("entropy")
        if self.entropy_coef <= 0 or entropy is None:
            return None
        if entropy[1] <= ENTROPY_BONUS_RISE * entropy[0] and "entropy_explosion" not in signals:
            return None
        why = (
            f"entropy rose from {entropy[0]:.3g} to {entropy[1]:.3g} nats with the entropy "
            f"bonus on (algorithm.entropy_coef {self.entropy_coef:g}): turn it off (or lower it)"
        )
        return Remedy("algorithm.entropy_coef", why, 0.0)

    def _kl_penalty(self) -> Remedy | None:
        kl = self._trend("kl")
        if self.kl_coef <= 0 or kl is None or not (kl[1] > KL_RISE * kl[0] and kl[1] > KL_LARGE):
            return None
        why = (
            f"the KL to the reference grew from {kl[0]:.3g} to {kl[1]:.3g} nats per token "
            f"under algorithm.kl_coef {self.kl_coef:g}: a stronger penalty holds the policy "
            "closer to it"
        )
        return Remedy("algorithm.kl_coef", why, self.kl_coef * KL_COEF_RAISE)

    def _step_size_cause(self, signals: set[str]) -> str:
        grad = self._trend("grad_norm")
        if "non_finite" in signals:
            cause = "updates were non-finite"
        elif "ratio_blowup" in signals:
            cause = "the sequence ratio blew up (the policy moved far within one batch)"
        elif grad is not None and grad[1] > GRAD_RISE * grad[0]:
            cause = f"the gradient norm rose from {grad[0]:.3g} to {grad[1]:.3g}"
        else:
            return "nothing points at the entropy bonus or KL penalty: lower the learning rate"
        return f"{cause}: the steps are too large, lower the learning rate"


def rollback_target(step: int) -> int:
    """Roll back to a checkpoint at least this old: a collapse is detected up to
    CRASH_POINTS steps after it began (step 0 is the starting policy)."""
    return max(0, step - CRASH_POINTS)


def resume_advice(
    run_dir: Path,
    lr: float,
    world: int = 1,
    argv: list[str] | None = None,
    remedy: Remedy | None = None,
) -> str:
    """The command that resumes a stopped run with `remedy`'s setting, or at the peak learning
    rate `lr` when the remedy is the learning rate (or none is given): the `gspo train`
    command line `argv` (after `gspo`) when there is one, else the run folder's own resolved
    recipe. Either way it resumes on as many processes (a --hostfile it cannot know)."""
    key = "optimizer.lr" if remedy is None else remedy.key
    value = lr if remedy is None or remedy.value is None else remedy.value
    if argv and argv[0] == "train":
        args = _without(argv, key)
    else:  # called from Python, not the command line
        args = ["train", str(run_dir / RECIPE), "--out", str(run_dir)]
    if world > 1 and not any(a == "--nproc" or a.startswith("--nproc=") for a in args):
        args += ["--nproc", str(world)]  # a launched rank's own argv has no --nproc
    return resume_command([*args, "--set", f"{key}={value:.3g}"])


def _without(argv: list[str], key: str) -> list[str]:
    """`argv` less any `--set KEY=...` (the advice gives a new one)."""
    args: list[str] = []
    for arg in argv:
        if arg.startswith(f"{key}=") and args and args[-1] == "--set":
            args.pop()
        elif not arg.startswith(f"--set={key}="):
            args.append(arg)
    return args
