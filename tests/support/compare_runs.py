"""Run folders for `gspo compare` written from Python (a recipe, metrics.jsonl, eval.jsonl, a
summary), a console that records what it prints, and a PNG's size: what the compare tests
share."""

from __future__ import annotations

import io
import json
import math
import struct
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console

Row = dict[str, Any]


def metrics_row(step: int, reward: float, entropy: float, **over: Any) -> Row:
    """A metrics.jsonl record as `gspo train` writes it (non-finite values as strings)."""
    row: Row = {
        "step": step,
        "loss": 0.01,
        "reward_mean": reward,
        "reward_std": 0.3,
        "accuracy": reward,
        "clip_frac": 0.15,
        "clip_frac_low": 0.05,
        "clip_frac_high": 0.10,
        "seq_ratio_min": 0.998,
        "seq_ratio_max": 1.002,
        "entropy": entropy,
        "grad_norm": 0.5,
        "response_len_mean": 40.0,
        "time_step_s": 2.0,
        "completion_tokens": 512,
        "tokens_per_s": 1000.0,
    }
    row.update(over)
    return {
        k: str(v) if isinstance(v, float) and not math.isfinite(v) else v for k, v in row.items()
    }


def write_run(
    root: Path,
    name: str,
    rows: list[Row],
    *,
    algorithm: str = "gspo",
    planned: int = 40,
    model: str = "builtin:tiny-dense",
    evals: dict[int, float] | None = None,
) -> Path:
    """`root/name`, a run folder of `rows` and `evals` (step: held-out accuracy)."""
    run = root / name
    run.mkdir(parents=True)
    clip = {"gspo": (3e-4, 4e-4), "grpo": (0.2, 0.27)}[algorithm]
    recipe = {
        "name": name,
        "model": {"path": model},
        "algorithm": {"name": algorithm, "clip_low": clip[0], "clip_high": clip[1]},
        "rollout": {"num_prompts": 16, "group_size": 8},
        "reward": {"functions": [{"name": "math", "weight": 1.0}]},
        "trainer": {"steps": planned},
    }
    (run / "recipe.yaml").write_text(yaml.safe_dump(recipe), encoding="utf-8")
    lines = [json.dumps(r) for r in rows]
    (run / "metrics.jsonl").write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    evals = evals or {}
    eval_lines = [
        json.dumps({"step": s, "accuracy": a, "num_problems": 40}) for s, a in evals.items()
    ]
    (run / "eval.jsonl").write_text("".join(e + "\n" for e in eval_lines), encoding="utf-8")
    summary = {"steps": rows[-1]["step"], "heldout_accuracy": {str(s): a for s, a in evals.items()}}
    (run / "summary.json").write_text(json.dumps(summary), encoding="utf-8")
    return run


def recording_console() -> Console:
    """A wide, colourless console that keeps what it prints (read with `console_text`)."""
    return Console(file=io.StringIO(), width=200, record=True, color_system=None)


def console_text(console: Console) -> str:
    return console.export_text()


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) from the PNG signature and IHDR chunk."""
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR", path
    width, height = struct.unpack(">II", head[16:24])
    return width, height
