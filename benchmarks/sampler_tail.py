"""The rollout sampler's accuracy in a vocabulary's far tail, and its cost per decoding step.

    .venv/bin/python benchmarks/sampler_tail.py [--draws 20000] [--rounds 7]

Accuracy: a law with 99% of its mass on one token and 1% spread evenly over the other 151,935
(each ~6.6e-8), drawn `--draws` times by each sampler; prints the tail's share (1.00% is right)
and its z-score. Cost: milliseconds per call on 64 rows of random logits at Qwen's vocabulary
(151,936) and SmolLM2's (49,152), median of `--rounds` interleaved rounds, one torch thread.

Samplers: `exact` is the one rollouts use (rollout/seeded.py: float64 softmax, running sum and
uniform); `gumbel-f32` is the Gumbel-max sampler it replaced (argmax of the scores plus noise
from float32 uniforms); `multinomial` is torch.multinomial on the float32 softmax, as
`generate` samples. Prints; asserts nothing. Figures depend on the CPU and its load.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Callable

import torch

from gspo_cli.rollout.seeded import ExactSampling

Sampler = Callable[[torch.Tensor, torch.Generator], torch.Tensor]  # [n, V] -> [n] token ids


def gumbel_f32(scores: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    noise = torch.empty(scores.shape).uniform_(generator=generator)  # [n, V], 24 random bits
    noise.clamp_(min=torch.finfo(noise.dtype).tiny).log_().neg_().log_().neg_()
    return (scores + noise).argmax(-1)


def exact(scores: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    sampler = ExactSampling(None)
    sampler.generators = [generator]
    ids = torch.zeros((scores.shape[0], 1), dtype=torch.long)
    return sampler(ids, scores).argmax(-1)  # type: ignore[arg-type]


def multinomial(scores: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    return torch.multinomial(torch.softmax(scores, -1), 1, generator=generator).squeeze(1)


SAMPLERS: dict[str, Sampler] = {
    "exact": exact,
    "gumbel-f32": gumbel_f32,
    "multinomial": multinomial,
}


def tail_share(sampler: Sampler, draws: int, vocab: int = 151_936, chunk: int = 25) -> float:
    log_p = torch.full((chunk, vocab), math.log(0.01 / (vocab - 1)))  # [chunk, V]
    log_p[:, 0] = math.log(0.99)
    generator = torch.Generator().manual_seed(0)
    tail = sum(int((sampler(log_p, generator) != 0).sum()) for _ in range(draws // chunk))
    return tail / (draws // chunk * chunk)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"tail share of a 1% tail over 151,935 tokens, {args.draws} draws (right: 1.00%)")
    sd = math.sqrt(0.01 * 0.99 / args.draws)
    for name, sampler in SAMPLERS.items():
        share = tail_share(sampler, args.draws)
        print(f"  {name:12s} {share:.2%}  z = {(share - 0.01) / sd:+.1f}")
    for vocab in (151_936, 49_152):
        scores = torch.randn(64, vocab, generator=torch.Generator().manual_seed(1))
        generator = torch.Generator().manual_seed(2)
        times: dict[str, list[float]] = {name: [] for name in SAMPLERS}
        for _ in range(args.rounds):  # interleaved: load drifts hit every sampler alike
            for name, sampler in SAMPLERS.items():
                start = time.perf_counter()
                sampler(scores, generator)
                times[name].append(time.perf_counter() - start)
        medians = {name: statistics.median(t) * 1000 for name, t in times.items()}
        cells = ", ".join(f"{name} {ms:.1f} ms" for name, ms in medians.items())
        print(
            f"64 rows x {vocab:,}: {cells} (exact / gumbel-f32 = "
            f"{medians['exact'] / medians['gumbel-f32']:.2f}x)"
        )


if __name__ == "__main__":
    main()
