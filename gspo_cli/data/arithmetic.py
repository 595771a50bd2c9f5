"""`builtin:arithmetic`: multi-step integer arithmetic with worked solutions, from a seed.

`slip_rate` makes the cold-start data imperfect the way real SFT data is: that share of
worked solutions gets one step off by one, carried through to a wrong boxed answer. The
reference `answer` is always right, so a verifier-driven RL stage can learn to stop slipping.
`tool_rate` is the share that compute in a ```python block instead (for tool use).
`unboxed_rate` is the share of solutions that end "Answer: N" instead of "\\boxed{N}": right
or wrong, the maths verifier scores those 0, so RL has a format habit to unlearn as well.

A problem is evaluated left to right, e.g. "Compute 12+7-5." whose worked solution is
"12+7=19\n19-5=14\n\\boxed{14}". With '*' the prefix is parenthesised so that left-to-right
is also the conventional reading: "(3+4)*2".
"""

from __future__ import annotations

import random
from typing import Any, Protocol

SPLIT_SALT = {"train": 0, "test": 1}
# A worked solution that computes with the interpreter: the ```output block is exactly what
# rollout.tools' interpreter appends (rollout/tools/interpreter.py), so that RL sees real ones.
TOOL_SOLUTION = "```python\nprint({expression})\n```\n```output\n{value}\n```\n\\boxed{{{value}}}"


class ArithmeticSettings(Protocol):
    """The task's knobs, as the recipe's data.arithmetic section has them (read-only here)."""

    @property
    def num_train(self) -> int: ...
    @property
    def num_eval(self) -> int: ...
    @property
    def min_ops(self) -> int: ...
    @property
    def max_ops(self) -> int: ...
    @property
    def max_operand(self) -> int: ...
    @property
    def operators(self) -> str: ...
    @property
    def slip_rate(self) -> float: ...
    @property
    def unboxed_rate(self) -> float: ...
    @property
    def tool_rate(self) -> float: ...


def _apply(a: int, op: str, b: int) -> int:
    return a + b if op == "+" else a - b if op == "-" else a * b


def make_problem(rng: random.Random, cfg: ArithmeticSettings) -> dict[str, Any]:
    n_ops = rng.randint(cfg.min_ops, cfg.max_ops)
    first = rng.randint(0, cfg.max_operand)
    ops = [(rng.choice(cfg.operators), rng.randint(0, cfg.max_operand)) for _ in range(n_ops)]
    slip_step = rng.randrange(n_ops) if rng.random() < cfg.slip_rate else -1
    slip = rng.choice((-1, 1))
    expression, value, written, steps = str(first), first, first, []
    for i, (op, operand) in enumerate(ops):
        value = _apply(value, op, operand)  # the true running result
        shown = _apply(written, op, operand) + (slip if i == slip_step else 0)
        steps.append(f"{written}{op}{operand}={shown}")
        written = shown  # the solution carries its own (possibly slipped) result forward
        if op == "*" and any(c in expression for c in "+-"):
            expression = f"({expression})"
        expression = f"{expression}{op}{operand}"
    unboxed = rng.random() < cfg.unboxed_rate
    final = f"Answer: {written}" if unboxed else f"\\boxed{{{written}}}"
    solution = "\n".join([*steps, final])
    if cfg.tool_rate and rng.random() < cfg.tool_rate:  # drawn only when on: old seeds stay
        solution = TOOL_SOLUTION.format(expression=expression, value=value)
    return {"prompt": f"Compute {expression}.", "answer": str(value), "solution": solution}


def arithmetic_split(cfg: ArithmeticSettings, split: str, seed: int) -> list[dict[str, Any]]:
    """The train or test split; held-out problems never repeat a training expression."""
    if split not in SPLIT_SALT:
        raise ValueError(f"builtin:arithmetic has splits train and test, not {split!r}")
    train_prompts: set[str] = set()
    if split == "test":
        train_prompts = {p["prompt"] for p in arithmetic_split(cfg, "train", seed)}
    rng = random.Random(seed * 1000 + SPLIT_SALT[split])
    size = cfg.num_train if split == "train" else cfg.num_eval
    problems: list[dict[str, Any]] = []
    attempts = 0
    while len(problems) < size and attempts < size * 50:
        attempts += 1
        problem = make_problem(rng, cfg)
        if problem["prompt"] not in train_prompts:
            problems.append(problem)
    return problems
