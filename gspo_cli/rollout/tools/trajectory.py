"""Tool-using rollouts: a `RolloutEngine` that alternates model turns and tool calls.

Each trajectory grows by turns. A model turn is one `generate` call of the wrapped engine on
prompt + trajectory so far (token ids, never text), cut where the format says a call is complete;
the calls run (in parallel across trajectories); their results are tokenised once and appended
as environment tokens (`from_tool`), and the next turn continues from there. Everything stays
token in, token out: the trajectory is the engine's ids and the environment's ids, concatenated.

Budgets: `max_new_tokens` counts model and tool tokens; a result that would leave no room for a
model token is not appended (the trajectory ends, `ended_by_budget`); after `max_calls` calls no
turn is cut for a call any more (0: tools never run). Sampling stays exact: a turn cut after its
call drops only tokens sampled after it, and each turn is seeded from (response seed, turn).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from gspo_cli.rollout.base import RolloutEngine, Rows, SamplingParams
from gspo_cli.rollout.batch import RolloutBatch, ToolTrace
from gspo_cli.rollout.seeded import row_seeds
from gspo_cli.rollout.tools.base import Toolbox, ToolCall, ToolFormat, ToolResult, ToolSettings
from gspo_cli.sandbox.pool import default_pool

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

MAX_CALLS_REACHED = "not run: rollout.tools.max_calls reached"


@dataclass
class _Trajectory:
    prompt: list[int]
    seed: int | None
    toolbox: Toolbox | None = None  # made at the first call
    ids: list[int] = field(default_factory=list)
    from_tool: list[bool] = field(default_factory=list)
    logprobs: list[torch.Tensor] = field(default_factory=list)  # pieces, [len] each
    trace: ToolTrace = field(default_factory=ToolTrace)
    done: bool = False
    ended: bool = False  # its last model turn ended with end-of-turn


def turn_seed(response_seed: int, turn: int) -> int:
    """The seed of a response's `turn`-th model turn (turn 0: the response's own)."""
    if turn == 0:
        return response_seed
    return int(np.random.SeedSequence([response_seed, turn]).generate_state(1, np.uint64)[0] >> 1)


def call_cut(ids: list[int], tokenizer: PreTrainedTokenizerBase, fmt: ToolFormat) -> int | None:
    """The length of the shortest prefix of a turn's `ids` whose text holds a complete call
    (`fmt.stop`), or None. A longer prefix holds it too, so a binary search finds it."""
    if fmt.stop is None or not fmt.stop.search(
        str(tokenizer.decode(ids, skip_special_tokens=True))
    ):
        return None
    low, high = 1, len(ids)  # decode(ids[:high]) matches
    while low < high:
        middle = (low + high) // 2
        if fmt.stop.search(str(tokenizer.decode(ids[:middle], skip_special_tokens=True))):
            high = middle
        else:
            low = middle + 1
    return high


class ToolUseEngine:
    """Wraps a rollout engine; `generate` returns whole tool trajectories (module docstring)."""

    def __init__(
        self,
        engine: RolloutEngine,
        tokenizer: PreTrainedTokenizerBase,
        settings: ToolSettings,
        fmt: ToolFormat,
        make_toolbox: Callable[[Mapping[str, Any] | None], Toolbox],
    ) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.settings = settings
        self.fmt = fmt
        self.make_toolbox = make_toolbox
        self.eos_id = int(tokenizer.eos_token_id)

    def sync_weights(self) -> None:
        self.engine.sync_weights()

    def close(self) -> None:
        self.engine.close()

    def generate(
        self,
        prompts: list[list[int]],
        params: SamplingParams,
        seeds: list[int] | None = None,
        rows: Rows | None = None,
    ) -> RolloutBatch:
        g = params.num_samples
        response_seeds = None if seeds is None else row_seeds(seeds, g)
        trajectories = [
            _Trajectory(prompt, None if response_seeds is None else response_seeds[i * g + j])
            for i, prompt in enumerate(prompts)
            for j in range(g)
        ]
        for i, t in enumerate(trajectories):  # one each, for its whole life (an environment)
            t.toolbox = self.make_toolbox(None if rows is None else rows[i // g])
        # an engine that sleeps between calls (vLLM on CUDA) stays awake for all the turns
        held = getattr(self.engine, "held", contextlib.nullcontext)
        try:
            with held():
                turn = 0
                while active := [t for t in trajectories if not t.done]:
                    pending = self._model_turn(active, params, turn)
                    self._run_calls(pending, params.max_new_tokens)
                    turn += 1
            return self._batch(trajectories, params)
        finally:
            for t in trajectories:
                if t.toolbox is not None:
                    t.toolbox.close()

    def _model_turn(
        self, active: list[_Trajectory], params: SamplingParams, turn: int
    ) -> list[tuple[_Trajectory, list[ToolCall]]]:
        """One `generate` for every active trajectory; returns those whose turn made calls."""
        limit = self.settings.max_calls
        calling = any(t.trace.calls < limit for t in active)
        turn_params = replace(
            params,
            num_samples=1,
            max_new_tokens=max(params.max_new_tokens - len(t.ids) for t in active),
            stop=self.fmt.stop_strings if calling else (),
        )
        seeds = None
        if active[0].seed is not None:
            seeds = [turn_seed(t.seed or 0, turn) for t in active]
        out = self.engine.generate([t.prompt + t.ids for t in active], turn_params, seeds)
        assert len(out.completion_ids) == len(active)  # one turn per trajectory, in order
        pending = []
        for i, t in enumerate(active):
            ids = out.completion_ids[i][: params.max_new_tokens - len(t.ids)]  # its own room
            cut = call_cut(ids, self.tokenizer, self.fmt) if t.trace.calls < limit else None
            ids = ids if cut is None else ids[:cut]
            t.ended = cut is None and bool(ids) and ids[-1] == self.eos_id
            self._append(t, ids, out, i, from_tool=False)
            calls = []
            if t.trace.calls < limit and (cut is not None or t.ended):
                text = str(self.tokenizer.decode(ids, skip_special_tokens=False))
                calls = self.fmt.calls(text, t.ended)
            if calls:
                pending.append((t, self._within_limit(t, calls)))
            elif t.ended or len(t.ids) >= params.max_new_tokens:
                t.done = True
            # else: the engine stopped at a stop string that was no call: the turn goes on
        return pending

    def _within_limit(self, t: _Trajectory, calls: list[ToolCall]) -> list[ToolCall]:
        left = self.settings.max_calls - t.trace.calls
        refused = [dataclasses.replace(c, error=MAX_CALLS_REACHED) for c in calls[left:]]
        return calls[:left] + refused

    def _run_calls(
        self, pending: list[tuple[_Trajectory, list[ToolCall]]], max_new_tokens: int
    ) -> None:
        """Run each trajectory's calls (trajectories in parallel) and append the results."""
        results: list[list[ToolResult]] = default_pool().map(
            lambda item: item[0].toolbox.run(item[1]),  # type: ignore[union-attr]
            pending,
        )
        for (t, calls), outcome in zip(pending, results, strict=True):
            env_ids = self.fmt.result_ids(outcome)
            refused = sum(c.error == MAX_CALLS_REACHED for c in calls)  # answered, not run
            t.trace = replace(
                t.trace,
                calls=t.trace.calls + len(calls) - refused,
                refused=t.trace.refused + refused,
                errors=t.trace.errors + sum(r.error for r in outcome) - refused,
                seconds=t.trace.seconds + sum(r.seconds for r in outcome),
                cut_outputs=t.trace.cut_outputs + sum(r.cut for r in outcome),
                session_restarts=t.trace.session_restarts + sum(r.restarted for r in outcome),
            )
            if len(t.ids) + len(env_ids) >= max_new_tokens:  # no room left for the model
                t.trace = replace(t.trace, ended_by_budget=True)
                t.done, t.ended = True, False  # cut short: truncated
                continue
            self._append(t, env_ids, None, 0, from_tool=True)

    def _append(
        self, t: _Trajectory, ids: list[int], out: RolloutBatch | None, row: int, from_tool: bool
    ) -> None:
        t.ids += ids
        t.from_tool += [from_tool] * len(ids)
        if out is not None and out.completion_logprobs is not None:
            t.logprobs.append(out.completion_logprobs[row][: len(ids)])
        elif from_tool:  # context, never a target: no log-prob of its own
            t.logprobs.append(torch.zeros(len(ids)))
        if from_tool:
            t.trace = replace(t.trace, tool_tokens=t.trace.tool_tokens + len(ids))

    def _batch(self, trajectories: list[_Trajectory], params: SamplingParams) -> RolloutBatch:
        batch = RolloutBatch([], [], [] if params.logprobs else None, [], [])
        batch.from_tool, batch.tool_traces = [], []
        for t in trajectories:
            batch.prompt_ids.append(t.prompt)
            batch.completion_ids.append(t.ids)
            if batch.completion_logprobs is not None:
                dtype = next((p.dtype for p in t.logprobs if p.dtype == torch.float64), None)
                pieces = [p.to(dtype or torch.float32) for p in t.logprobs]
                batch.completion_logprobs.append(torch.cat(pieces) if pieces else torch.zeros(0))
            batch.texts.append(str(self.tokenizer.decode(t.ids, skip_special_tokens=True)))
            batch.truncated.append(not t.ended)
            batch.from_tool.append(t.from_tool)
            reward = t.toolbox.reward() if t.toolbox is not None else None
            batch.tool_traces.append(replace(t.trace, environment_reward=reward))
            assert len(t.ids) == len(t.from_tool) <= params.max_new_tokens
        return batch
