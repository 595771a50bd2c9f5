"""A side's own process: builds the model, then runs one cycle per "go" from the parent."""

from __future__ import annotations

import resource
import time

import torch

from .calls import Calls
from .channel import Channel
from .floor_side import FloorSide
from .gspo_side import GspoSide
from .shapes import Shape, build
from .trl_side import run_trl

SIDES = ("gspo", "gspo-defaults", "trl", "floor")


def worker(side: str, shape: Shape, workload: str, cycles: int) -> None:
    chan = Channel()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model, tokenizer = build(shape, workload)
    calls = Calls(model)
    chan.send(ready=True, parameters=sum(p.numel() for p in model.parameters()))
    if side == "trl":
        run_trl(model, tokenizer, shape, workload, cycles, chan, calls)
    else:
        runner: GspoSide | FloorSide = (
            FloorSide(model, tokenizer, shape, workload)
            if side == "floor"
            else GspoSide(model, tokenizer, shape, workload, side == "gspo-defaults", calls)
        )
        for _ in range(cycles):
            chan.wait()
            calls.take()
            start = time.perf_counter()
            result = runner.cycle()
            chan.send(seconds=time.perf_counter() - start, **result, calls=calls.take())
    chan.wait()  # the parent's last word, after every side's cycles
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    chan.send(peak_rss_mb=peak)
