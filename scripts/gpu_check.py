"""The checks a GPU user needs, on one CUDA machine with the project installed: `make gpu-check`.

    python scripts/gpu_check.py [--out gpu-check.md] [--steps 20] [--only NAME,...]

Each check is a real `gspo train` of the quickstart on CUDA (its own run folder under a temporary
directory) with a deadline; a check whose stack is missing (no vLLM, no DeepSpeed) is reported as
not run, with the reason, never as passed. Prints one table and writes it, with the machine's
bf16 matmul peak, to --out. Figures depend on the GPU, its clocks and the software versions the
table's header names; the quickstart's tiny model leaves a big GPU mostly idle, so step times
here measure overheads (launch, Python, synchronisation) more than arithmetic.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RECIPE = REPO / "recipes" / "quickstart.yaml"
CUDA_BF16 = ["trainer.device=cuda", "model.dtype=bfloat16"]
R2 = ["algorithm.name=grpo", "algorithm.routing_replay=old_policy"]
R3 = ["algorithm.name=grpo", "algorithm.routing_replay=rollout"]


@dataclass(frozen=True)
class Check:
    name: str
    what: str
    overrides: list[str]
    needs: str | None = None  # a module that must import, else "not run"
    recipe: Path = RECIPE


CHECKS = [
    Check("bf16", "GSPO steps of the quickstart, bf16 on CUDA (torch engine)", CUDA_BF16),
    Check(
        "zero2",
        "DeepSpeed ZeRO-2 on one GPU, bf16",
        [*CUDA_BF16, "trainer.engine=deepspeed", "deepspeed.zero_stage=2"],
        needs="deepspeed",
    ),
    Check(
        "zero3",
        "DeepSpeed ZeRO-3 on one GPU, bf16",
        [*CUDA_BF16, "trainer.engine=deepspeed", "deepspeed.zero_stage=3"],
        needs="deepspeed",
    ),
    Check("lora", "LoRA r 16 (all linear layers), bf16", [*CUDA_BF16, "model.lora.r=16"]),
    Check(
        "moe-r2",
        "tiny MoE, GRPO + Routing Replay R2, bf16",
        [*CUDA_BF16, *R2],
        recipe=REPO / "recipes" / "quickstart-moe.yaml",
    ),
    Check(
        "moe-r3",
        "tiny MoE, GRPO + Routing Replay R3 (HF engine's routed experts), bf16",
        [*CUDA_BF16, *R3],
        recipe=REPO / "recipes" / "quickstart-moe.yaml",
    ),
    Check(
        "vllm",
        "vLLM colocated (sleep mode, weight sync): engine vs trainer log-prob gap",
        [*CUDA_BF16, "rollout.engine=vllm"],
        needs="vllm",
    ),
    Check(
        "vllm-lora",
        "LoRA through vLLM",
        [*CUDA_BF16, "rollout.engine=vllm", "model.lora.r=16"],
        needs="vllm",
    ),
    Check(
        "moe-r3-vllm",
        "tiny MoE with Routing Replay R3 through vLLM",
        [*CUDA_BF16, *R3, "rollout.engine=vllm"],
        needs="vllm",
        recipe=REPO / "recipes" / "quickstart-moe.yaml",
    ),
]


def bf16_peak_tflops(size: int = 8192, repeats: int = 10) -> float:
    """The bf16 matmul rate of this GPU, the ceiling for hardware-use figures (random data)."""
    import torch

    a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        a @ b
    torch.cuda.synchronize()
    return 2 * size**3 * repeats / (time.perf_counter() - start) / 1e12


def run_check(check: Check, steps: int, root: Path, timeout_s: float) -> dict[str, str]:
    """One `gspo train` of `check`: its figures from the run folder, or why it did not pass."""
    row = {"check": check.name, "what": check.what}
    if check.needs and importlib.util.find_spec(check.needs) is None:
        return {**row, "result": f"not run: {check.needs} is not installed"}
    out = root / check.name
    sets = [*check.overrides, f"trainer.steps={steps}", f"eval.every={steps}"]
    sets += ["eval.num_problems=200", f"trainer.checkpoint_every={steps}"]
    argv = [sys.executable, "-m", "gspo_cli.cli", "train", str(check.recipe), "--out", str(out)]
    argv += [arg for value in sets for arg in ("--set", value)]
    start = time.perf_counter()
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {**row, "result": f"FAILED: still running after {timeout_s:.0f} s"}
    wall = time.perf_counter() - start
    (root / f"{check.name}.log").write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        last = (done.stderr.strip() or done.stdout.strip()).splitlines()[-1:] or ["no output"]
        return {**row, "result": f"FAILED (exit {done.returncode}): {last[0][:200]}"}
    return {**row, "result": "passed", **figures(out, wall)}


def figures(run: Path, wall_s: float) -> dict[str, str]:
    """Step time, tokens/s, peak GPU memory, engine gap and held-out accuracy of a run."""
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    evals = [json.loads(line) for line in (run / "eval.jsonl").read_text().splitlines()]
    steps = [m for m in metrics if "time_step_s" in m][1:] or metrics  # the first step warms up
    mean = lambda key: sum(m.get(key, 0.0) for m in steps) / len(steps)  # noqa: E731
    gap = max((m.get("mismatch_token_abs_max", 0.0) for m in steps), default=0.0)
    return {
        "step_s": f"{mean('time_step_s'):.2f}",
        "tokens_per_s": f"{mean('tokens_per_s'):.0f}",
        "peak_mem_mb": f"{max(m.get('peak_memory_mb', 0.0) for m in metrics):.0f}",
        "gap_max": f"{gap:.1e}",
        "heldout": f"{evals[0]['accuracy']:.1%} -> {evals[-1]['accuracy']:.1%}",
        "wall_s": f"{wall_s:.0f}",
    }


COLUMNS = ["check", "result", "step_s", "tokens_per_s", "peak_mem_mb", "gap_max", "heldout"]


def table(rows: list[dict[str, str]]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(row.get(c, "") for c in COLUMNS) + " |" for row in rows]
    return "\n".join(lines)


def header() -> str:
    import torch
    import transformers

    name = torch.cuda.get_device_name(0)
    return (
        f"{name}; torch {torch.__version__} (CUDA {torch.version.cuda}); "
        f"transformers {transformers.__version__}; bf16 matmul {bf16_peak_tflops():.0f} TFLOP/s"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("gpu-check.md"))
    parser.add_argument("--steps", type=int, default=20, help="GSPO steps per check")
    parser.add_argument("--only", default="", help="comma-separated check names")
    parser.add_argument("--timeout-s", type=float, default=150, help="deadline per check")
    parser.add_argument("--logs", type=Path, help="keep each check's output here")
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("gpu-check: no CUDA device; run it on a GPU machine", file=sys.stderr)
        return 2
    wanted = {name for name in args.only.split(",") if name}
    checks = [c for c in CHECKS if not wanted or c.name in wanted]
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    top = header()
    print(top, flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        root = args.logs or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        for check in checks:
            rows.append(run_check(check, args.steps, root, args.timeout_s))
            print(f"{check.name}: {rows[-1]['result']}", flush=True)
            args.out.write_text(f"{top}\n\n{table(rows)}\n")  # after each: a kill keeps it
    print(args.out.read_text())
    return 0 if all(not r["result"].startswith("FAILED") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
