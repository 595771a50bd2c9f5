"""Online difficulty filtering (`data.curriculum`; docs/environments.md): spend rollouts where
they teach.

A GRPO/GSPO group whose samples all score alike has zero advantage: no gradient. The curriculum
keeps each prompt's pass rate (its group's share of correct responses) over its last `visits`
visits, from the rollouts themselves; a prompt solved by every sample, or by none, on each of
those visits is set aside for `set_aside_epochs` epochs of its environment's prompt order, then
drawn again (its record starts afresh, so one visit can set it aside anew only after `visits`).

Where it differs: DAPO's dynamic sampling (arXiv 2503.14476) filters after generating, paying
for the groups it drops; prime-rl's buffer filters by thresholds on a rollout's reward as the
batch is built; POLARIS (2025) drops prompts solved every time from later stages of training for
good. Here a prompt is judged on several visits, never for good, and the position stays
checkpointed with the rest of the sampler, so a resume draws what the run would have.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class CurriculumSettings:
    visits: int  # K: a prompt is judged on its last K visits
    set_aside_epochs: int  # N: epochs of its environment a judged prompt sits out


@dataclass
class Curriculum:
    settings: CurriculumSettings
    history: dict[int, list[float]] = field(default_factory=dict)  # row -> last pass rates
    until: dict[int, int] = field(default_factory=dict)  # row -> first epoch it is drawn again
    set_aside_this_step: int = 0
    released: int = 0  # set-aside rows let back early: their environment had no other left

    def skips(self, row: int, epoch: int) -> bool:
        """True while `row` sits out (its environment is in epoch `epoch`)."""
        back = self.until.get(row)
        if back is None:
            return False
        if epoch >= back:
            del self.until[row]
            return False
        return True

    def observe(self, rows: list[int], pass_rates: list[float], epochs: list[int]) -> None:
        """A step's groups: row `rows[i]` scored `pass_rates[i]` (its environment then in epoch
        `epochs[i]`); rows all or never solved on their last K visits are set aside."""
        k = self.settings.visits
        for row, rate, epoch in zip(rows, pass_rates, epochs, strict=True):
            seen = [*self.history.get(row, []), rate][-k:]
            self.history[row] = seen
            flat = len(seen) == k and (all(r == 1.0 for r in seen) or all(r == 0.0 for r in seen))
            if flat and row not in self.until:
                self.until[row] = epoch + 1 + self.settings.set_aside_epochs
                del self.history[row]  # judged afresh when it comes back
                self.set_aside_this_step += 1

    def release(self, rows: range) -> None:
        """Let every set-aside row of `rows` back (its environment has nothing else to draw)."""
        back = [row for row in self.until if row in rows]
        for row in back:
            del self.until[row]
        self.released += len(back)

    def metrics(self) -> dict[str, float]:
        """The step's: prompts set aside now, newly, and let back early (then reset)."""
        out = {
            "curriculum_set_aside": float(len(self.until)),
            "curriculum_set_aside_new": float(self.set_aside_this_step),
            "curriculum_released": float(self.released),
        }
        self.set_aside_this_step = self.released = 0
        return out

    def state_dict(self) -> dict[str, Any]:
        return {
            "history": {str(row): rates for row, rates in self.history.items()},
            "until": {str(row): epoch for row, epoch in self.until.items()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.history = {
            int(row): [float(r) for r in rates] for row, rates in state["history"].items()
        }
        self.until = {int(row): int(epoch) for row, epoch in state["until"].items()}
