"""A run's environments (recipe `environments`; docs/environments.md): each one's problems,
held-out set and step plan, read off its view of the recipe (recipe/environments.py).

The run's training rows are every environment's, one after the other (`RunEnvironment.rows`
says which are whose): the sampler, the cold start and the logs index that one list.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from transformers import PreTrainedTokenizerBase

from gspo_cli.data.problems import Problem
from gspo_cli.recipe.schema import Recipe
from gspo_cli.rollout.tool_settings import ToolSettings
from gspo_cli.train.run.problem_sets import Problems, run_problems
from gspo_cli.train.run.step_settings import rollout_params
from gspo_cli.train.step.curriculum import Curriculum, CurriculumSettings
from gspo_cli.train.step.environments import ENV_PREFIX, EnvironmentPlan
from gspo_cli.train.step.sampler import MixtureSampler, WeightSchedule


@dataclass
class RunEnvironment:
    name: str
    weight: float  # its share of each step's prompts (0: evaluated only)
    recipe: Recipe  # the recipe as it reads for this environment
    train: Problems
    heldout: list[Problem]
    rows: range  # its training rows in the run's list
    cold_start: bool  # its rows join the cold start's SFT data
    weight_final: float | None = None  # its weight at the last step (linear), None: fixed


@dataclass
class RunEnvironments:
    environments: list[RunEnvironment]
    train: Problems  # every environment's training problems, one after the other
    notes: list[str]  # console lines: rows set aside or dropped, per environment

    @property
    def several(self) -> bool:
        return len(self.environments) > 1

    def sampler(self, recipe: Recipe) -> MixtureSampler:
        """The run's prompt order (seeded by data.seed + trainer.seed), with `data.curriculum`
        when it is enabled and the environments' weight schedule when one has weight_final."""
        curriculum = recipe.data.curriculum
        settings = CurriculumSettings(curriculum.visits, curriculum.set_aside_epochs)
        first = [env.weight for env in self.environments]
        last = [
            env.weight if env.weight_final is None else env.weight_final
            for env in self.environments
        ]
        return MixtureSampler(
            [len(env.train.rows) for env in self.environments],
            first,
            recipe.data.seed + recipe.trainer.seed,
            Curriculum(settings) if curriculum.enabled else None,
            None if last == first else WeightSchedule(first, last, recipe.trainer.steps),
        )

    def cold_start_set(self) -> Problems:
        """The training problems of the environments whose rows the cold start imitates."""
        chosen = [env for env in self.environments if env.cold_start]
        return _joined(chosen)

    def plans(self) -> list[EnvironmentPlan]:
        """What the step needs of each environment, in plain values."""
        return [
            EnvironmentPlan(
                env.name,
                env.recipe.tool_settings(),
                env.recipe.reward,
                rollout_params(env.recipe),
                env.rows,
            )
            for env in self.environments
        ]


def load_environments(recipe: Recipe, tokenizer: PreTrainedTokenizerBase) -> RunEnvironments:
    """Every environment's problems; with several, each note names its environment."""
    views = recipe.environments_resolved()
    environments: list[RunEnvironment] = []
    notes: list[str] = []
    start = 0
    for view in views:
        problems = run_problems(view.recipe, tokenizer)
        size = len(problems.train.rows)
        rows = range(start, start + size)
        environments.append(
            RunEnvironment(
                view.name,
                view.weight,
                view.recipe,
                problems.train,
                problems.heldout,
                rows,
                view.cold_start,
                view.weight_final,
            )
        )
        prefix = f"environment {view.name}: " if len(views) > 1 else ""
        notes += [prefix + line for line in problems.notes]
        start += size
    train = _joined(environments)
    return RunEnvironments(environments, train, notes)


def _joined(environments: list[RunEnvironment]) -> Problems:
    """The environments' training problems, one environment after the other."""
    return Problems(
        [row for env in environments for row in env.train.rows],
        [prompt for env in environments for prompt in env.train.prompts],
    )


def mixed_heldout(
    environments: list[RunEnvironment], values: dict[str, dict[str, float]]
) -> dict[str, float]:
    """The run's held-out metrics from each environment's (`values` by name): env/NAME/...
    for each, and accuracy as the mean weighted by the environments' weights (those of
    weight 0 are evaluated, not counted), its interval from the environments' half-widths
    (independent samples: half = sqrt(sum (w_e / W)^2 half_e^2))."""
    counted = [env for env in environments if env.weight > 0]
    total = sum(env.weight for env in counted)
    accuracy = sum(env.weight * values[env.name]["accuracy"] for env in counted) / total
    half = math.sqrt(
        sum((env.weight / total * _half_width(values[env.name])) ** 2 for env in counted)
    )
    out = {
        "accuracy": accuracy,
        "accuracy_ci_low": max(0.0, accuracy - half),
        "accuracy_ci_high": min(1.0, accuracy + half),
        "num_problems": float(sum(len(env.heldout) for env in environments)),
    }
    for env in environments:
        out.update({f"{ENV_PREFIX}{env.name}/{k}": v for k, v in values[env.name].items()})
    return out


def _half_width(values: dict[str, float]) -> float:
    return (values["accuracy_ci_high"] - values["accuracy_ci_low"]) / 2


def any_tools(recipe: Recipe) -> ToolSettings | None:
    """The first environment's tools that has some (the rollout engine prepares for tools when
    one environment calls them), else None."""
    for view in recipe.environments_resolved():
        tools = view.recipe.tool_settings()
        if tools is not None:
            return tools
    return None
