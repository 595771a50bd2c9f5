"""`builtin:arithmetic`: multi-step integer arithmetic with worked solutions, from a seed.

A problem is evaluated left to right, e.g. "Compute 12+7-5." whose worked solution is
"12+7=19\n19-5=14\n\\boxed{14}". With '*' the prefix is parenthesised so that left-to-right
is also the conventional reading: "(3+4)*2".
"""

from __future__ import annotations

import random
from typing import Any

from gspo_cli.recipe.schema import ArithmeticTaskConfig

SPLIT_SALT = {"train": 0, "test": 1}


def _apply(a: int, op: str, b: int) -> int:
    return a + b if op == "+" else a - b if op == "-" else a * b


def make_problem(rng: random.Random, cfg: ArithmeticTaskConfig) -> dict[str, Any]:
    n_ops = rng.randint(cfg.min_ops, cfg.max_ops)
    value = rng.randint(0, cfg.max_operand)
    expression, steps = str(value), []
    for _ in range(n_ops):
        op, operand = rng.choice(cfg.operators), rng.randint(0, cfg.max_operand)
        result = _apply(value, op, operand)
        steps.append(f"{value}{op}{operand}={result}")
        needs_parens = op == "*" and any(c in expression for c in "+-")
        expression = (
            f"({expression}){op}{operand}" if needs_parens else f"{expression}{op}{operand}"
        )
        value = result
    solution = "\n".join([*steps, f"\\boxed{{{value}}}"])
    return {"prompt": f"Compute {expression}.", "answer": str(value), "solution": solution}


def arithmetic_split(cfg: ArithmeticTaskConfig, split: str, seed: int) -> list[dict[str, Any]]:
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
