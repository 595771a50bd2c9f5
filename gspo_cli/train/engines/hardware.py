"""The machine's matmul peak (MFU's denominator), measured once per machine and cached, and the
step's MFU from its counted FLOPs (models/flops.py).

The peak is measured, never looked up: fp32 `torch.mm` of square matrices on a CPU (at the
process's torch thread count), bf16 on a CUDA GPU, best of a few repetitions. It is cached in
`matmul_peak.json` under the gspo-cli cache (models/gguf.py's `cache_root`: $GSPO_CACHE, else
~/.cache/gspo-cli), keyed by the CPU model, the thread count, torch's version and the device's
name, so a machine measures each key once (about 1 s) and every later run reads it.
"""

from __future__ import annotations

import json
import platform
import time
from pathlib import Path

import torch

from gspo_cli.models.gguf import cache_root
from gspo_cli.runs.folder import write_text_atomic
from gspo_cli.train.engines.distributed import DistContext

PEAK_FILE = "matmul_peak.json"
# Square sizes: large enough to reach the kernels' plateau, small enough for ~1 s in total.
CPU_SIZE, GPU_SIZE = 2048, 8192
REPEATS = 5  # timed repetitions, the best kept (the others lost time to the machine's other work)
GPU_INNER = 10  # matmuls per timed GPU repetition: one is too short to time with a host clock

_MEASURED: dict[str, float] = {}  # this process's peaks by key: the file is read once
_RANK_PEAKS: dict[str, float] = {}  # rank_peak's: its turns are taken once per process


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def peak_key(device: torch.device) -> str:
    """What the peak depends on: the CPU model, torch's thread count and version, the device."""
    name = "cpu fp32"
    if device.type == "cuda":
        name = f"{torch.cuda.get_device_name(device)} bf16"
    return (
        f"{_cpu_model()} | threads {torch.get_num_threads()} | torch {torch.__version__} | {name}"
    )


def measure_matmul_peak(device: torch.device, size: int | None = None) -> float:
    """FLOP/s of the best of REPEATS `torch.mm` of `size` x `size` matrices on `device` (fp32
    on a CPU, bf16 on a GPU), after one warm-up."""
    cuda = device.type == "cuda"
    size = size or (GPU_SIZE if cuda else CPU_SIZE)
    dtype, inner = (torch.bfloat16, GPU_INNER) if cuda else (torch.float32, 1)
    generator = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(size, size, device=device, dtype=dtype, generator=generator)
    b = torch.randn(size, size, device=device, dtype=dtype, generator=generator)
    out = torch.mm(a, b)  # warm-up: kernel choice, allocation
    best = float("inf")
    for _ in range(REPEATS):
        if cuda:
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        for _ in range(inner):
            torch.mm(a, b, out=out)
        if cuda:
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - start)
    return 2.0 * size**3 * inner / best


def _read(path: Path) -> dict[str, float]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):  # none yet, or unreadable: measured again
        return {}
    return (
        {k: float(v) for k, v in data.items() if isinstance(v, int | float)}
        if isinstance(data, dict)
        else {}
    )


def peak_flops(device: torch.device, cache_dir: Path | None = None) -> float:
    """The matmul peak of `device` in FLOP/s: this process's, else the cache's, else measured
    now and added to the cache (an atomic rewrite; an unwritable cache only costs a re-measure)."""
    key = peak_key(device)
    if key in _MEASURED:
        return _MEASURED[key]
    path = (cache_dir or cache_root()) / PEAK_FILE
    known = _read(path)
    if key not in known:
        peak = measure_matmul_peak(device)
        known = {**_read(path), key: peak}  # read again: another process may have added a key
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_text_atomic(path, json.dumps(known, indent=1, sort_keys=True) + "\n")
        except OSError:
            pass
    _MEASURED[key] = known[key]
    return known[key]


def rank_peak(device: torch.device, ctx: DistContext) -> float:
    """This rank's peak; the ranks take turns at their first call, so processes sharing a CPU do
    not measure under each other's load. Collective: every rank calls it at the same point of
    every step."""
    key = peak_key(device)
    # every rank agrees whether turns are needed (ranks as threads share this module's memo)
    if ctx.all_reduce_max(0.0 if key in _RANK_PEAKS else 1.0):
        for turn in range(ctx.world):
            if turn == ctx.rank:
                _RANK_PEAKS[key] = peak_flops(device)
            ctx.barrier()
    return _RANK_PEAKS[key]
