"""`judge`: an LLM judge (or a built-in rule) as a reward, pointwise or per group.

Every question goes through the cache first; the rest are asked with at most `max_concurrency`
calls at a time. A reply that does not parse counts in `judge/parse_failures` and scores
`on_parse_failure` (a number, or skip: None, which the entry's `none_as: skip` leaves out); a
call that fails (refused, timed out, a broken answer) counts in `judge/errors` and, with
`on_error: fail`, ends the run as one line naming the judge and the error, with `skip`, is
None. Never a silent 0. In group mode a group is a run of consecutive completions of one prompt
(the G responses of a rollout group); a group's failure is counted once per completion.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal

from gspo_cli.rewards.context import RewardContext
from gspo_cli.rewards.judges.backends import (
    BUILTIN_PREFIX,
    URL_PREFIXES,
    JudgeError,
    ask_local,
    ask_url,
    builtin_score,
)
from gspo_cli.rewards.judges.cache import JudgeCache, cache_key, open_cache
from gspo_cli.rewards.judges.spec import ParseFailure, ScoreReader, render
from gspo_cli.rewards.reward_model import prompt_text

PARSE_FAILURES, ERRORS, CALLS, CACHED, SCORED = (
    "judge/parse_failures",
    "judge/errors",
    "judge/calls",
    "judge/cache_hits",
    "judge/scored",  # completions a model judge scored: what parse failures are a share of
)
Failure = Literal["skip"] | float


def parse_failure_share(metrics: Mapping[str, float]) -> float | None:
    """The share of a step's judged completions whose judge reply did not parse; None when no
    model judge scored any."""
    scored = metrics.get(SCORED, 0.0)
    return metrics.get(PARSE_FAILURES, 0.0) / scored if scored else None


@dataclass(frozen=True)
class Judge:
    """One judge's settings, as the recipe gave them (defaults filled by the caller)."""

    model: str
    template: str
    reader: ScoreReader
    mode: str
    on_parse_failure: Failure
    on_error: Literal["skip", "fail"]
    max_concurrency: int
    timeout_s: float
    max_new_tokens: int
    api_model: str
    api_key_env: str | None

    @property
    def id(self) -> str:
        """What besides the template its answers depend on: the cache's judge id."""
        r = self.reader
        return f"{self.model}|{self.api_model}|{self.mode}|{r.rule}|{r.low:g}:{r.high:g}"

    def score(
        self,
        completions: list[str],
        prompts: list[Any],
        answers: list[Any],
        context: RewardContext,
    ) -> list[float | None]:
        """One score per completion, in [0, 1] or by the failure rules."""
        if self.model.startswith(BUILTIN_PREFIX):
            return self._builtin(completions, answers, context)
        context.count(SCORED, len(completions))
        groups = _groups(prompts) if self.mode == "group" else [[i] for i in range(len(prompts))]
        cache = _cache(context)
        questions = [(prompts[g[0]], [completions[i] for i in g]) for g in groups]
        keys = [cache_key(self.id, self.template, p, cs) for p, cs in questions]
        found = [cache.get(k) for k in keys]
        todo = [j for j, hit in enumerate(found) if hit is None]
        context.count(CACHED, len(groups) - len(todo))
        context.count(CALLS, len(todo))
        texts = [render(self.template, prompt_text(p), cs, self.mode) for p, cs in questions]
        replies = self._ask([texts[j] for j in todo], context)
        reply_of = dict(zip(todo, replies, strict=True))
        scores: list[float | None] = [None] * len(completions)
        parse_failures = errors = 0
        for j, group in enumerate(groups):
            hit = found[j]
            got: list[float | None] = list(hit) if hit is not None else []
            if hit is None:
                got, failed = self._read(reply_of[j], len(group), keys[j], cache)
                parse_failures += len(group) if failed == PARSE_FAILURES else 0
                errors += len(group) if failed == ERRORS else 0
            for i, value in zip(group, got, strict=True):
                scores[i] = value
        context.count(PARSE_FAILURES, parse_failures)
        context.count(ERRORS, errors)
        return scores

    def _read(
        self, reply: str | JudgeError, count: int, key: str, cache: JudgeCache
    ) -> tuple[list[float | None], str | None]:
        """(scores, which failure if any) of one reply; a parsed one is cached."""
        if isinstance(reply, JudgeError):
            return [None] * count, ERRORS
        try:
            values = self.reader.read(reply, count)
        except ParseFailure:
            fallback = None if self.on_parse_failure == "skip" else float(self.on_parse_failure)
            return [fallback] * count, PARSE_FAILURES
        cache.put(key, values)
        return list(values), None

    def _ask(self, texts: list[str], context: RewardContext) -> list[str | JudgeError]:
        """The replies, or the JudgeError of each failed call; `on_error: fail` raises the
        first as a ValueError naming the judge (the reward contract's one line, exit 2)."""
        if not texts:
            return []
        if self.model.startswith(URL_PREFIXES):
            ask: Callable[[str], str] = lambda text: ask_url(  # noqa: E731
                self.model,
                text,
                api_model=self.api_model,
                max_tokens=self.max_new_tokens,
                timeout_s=self.timeout_s,
                api_key_env=self.api_key_env,
            )
            with ThreadPoolExecutor(min(self.max_concurrency, len(texts))) as pool:
                replies = list(pool.map(lambda t: _caught(ask, t), texts))
        else:
            replies = self._ask_local(texts, context)
        failed = next((r for r in replies if isinstance(r, JudgeError)), None)
        if failed is not None and self.on_error == "fail":
            context.count(ERRORS, sum(isinstance(r, JudgeError) for r in replies))
            raise ValueError(f"judge {self.model}: {failed} (on_error: fail)")
        return replies

    def _ask_local(self, texts: list[str], context: RewardContext) -> list[str | JudgeError]:
        try:
            out = ask_local(
                self.model,
                texts,
                device=context.torch_device(),
                max_new_tokens=self.max_new_tokens,
                batch_size=self.max_concurrency,
            )
        except JudgeError as exc:  # the model does not load: every call failed
            return [exc] * len(texts)
        return list(out)

    def _builtin(
        self, completions: list[str], answers: list[Any], context: RewardContext
    ) -> list[float | None]:
        name = self.model[len(BUILTIN_PREFIX) :]
        try:
            scores: list[float | None] = [
                builtin_score(name, c, a) for c, a in zip(completions, answers, strict=True)
            ]
        except JudgeError as exc:  # no reference answer: a data problem, never a silent 0
            context.count(ERRORS, len(completions))
            raise ValueError(f"judge {self.model}: {exc}") from None
        context.count(PARSE_FAILURES, 0)
        context.count(ERRORS, 0)
        return scores


def _caught(ask: Callable[[str], str], text: str) -> str | JudgeError:
    try:
        return ask(text)
    except JudgeError as exc:
        return exc


def _groups(prompts: list[Any]) -> list[list[int]]:
    """Runs of consecutive completions with one prompt: a rollout's groups."""
    groups: list[list[int]] = []
    for i, prompt in enumerate(prompts):
        if groups and prompts[groups[-1][0]] == prompt:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def _cache(context: RewardContext) -> JudgeCache:
    if context.cache_path is not None:
        return open_cache(context.cache_path)
    cache = context.memo.setdefault("judge_cache", JudgeCache(None))
    assert isinstance(cache, JudgeCache)
    return cache
