"""The quickstart's own workload for `vs_trl --workload quickstart`: its model after its cold
start, its training prompts and its maths verifier, so the lengths and the groups without
signal are whatever that model samples (nothing is drawn or forced).

The parent runs `gspo sft recipes/quickstart.yaml` once (the 400 SFT steps of the quickstart's
cold start, about a minute on one thread) into a temporary folder and hands its path to every
side through MODEL_ENV; each side loads that checkpoint.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

RECIPE = Path(__file__).resolve().parent.parent / "recipes" / "quickstart.yaml"
MODEL_ENV = "GSPO_VS_TRL_QUICKSTART_MODEL"


def cold_start(folder: str) -> str:
    """The quickstart's cold-started checkpoint, made under `folder`; its path."""
    command = "from gspo_cli.cli import main; main()"
    out = os.path.join(folder, "quickstart-sft")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run(
        [sys.executable, "-c", command, "sft", str(RECIPE), "--out", out], check=True, env=env
    )
    return os.path.join(out, "cold_start")


def load() -> tuple[Any, Any]:
    """The cold-started model (float32, training mode) and its tokenizer, in a side."""
    from gspo_cli.models.loading import load_policy

    model, tokenizer = load_policy(os.environ[MODEL_ENV])
    return model.float().train(), tokenizer


def prompts(tokenizer: Any, count: int) -> list[tuple[str, str]]:
    """(prompt text, gold answer) of the first `count` training problems whose rendered prompt
    has the commonest length, so that no side pads a prompt (the floor cannot)."""
    from gspo_cli.data.prompts import render_prompt
    from gspo_cli.data.sources import load_rows
    from gspo_cli.recipe import load_recipe

    data = load_recipe(RECIPE).data
    rows = load_rows(data.source, "train", data)
    rendered = [render_prompt(tokenizer, row["prompt"], data) for row in rows]
    width = Counter(len(ids) for ids in rendered).most_common(1)[0][0]
    chosen = [(ids, row) for ids, row in zip(rendered, rows, strict=True) if len(ids) == width]
    chosen = chosen[:count]
    texts = [(tokenizer.decode(ids), str(row["answer"])) for ids, row in chosen]
    for (text, _), (ids, _) in zip(texts, chosen, strict=True):
        assert tokenizer(text)["input_ids"] == ids, "a prompt does not survive decode + encode"
    return texts


def score(texts: list[str], answers: list[str]) -> list[float]:
    """The quickstart's reward: 1 when the last boxed answer equals the gold one (Math-Verify)."""
    from gspo_cli.rewards.math_verifier import check_answer

    return [check_answer(text, gold) for text, gold in zip(texts, answers, strict=True)]
