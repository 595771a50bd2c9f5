"""The `judge` reward against a stub OpenAI-compatible server started here (canned answers, one
that hangs, one that answers garbage, a refused port), the built-in rules, a local causal LM
judge, the on-disk cache, and what the recipe refuses at validate time."""

from __future__ import annotations

import json
import re
import socket
import threading
import time
import typing
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from gspo_cli.core.errors import GspoError
from gspo_cli.recipe.reward import RewardConfig, RewardFunctionConfig
from gspo_cli.rewards.binding import RewardServices
from gspo_cli.rewards.context import RewardContext
from gspo_cli.rewards.judges import cache as judge_cache
from gspo_cli.rewards.judges.cache import JudgeCache
from gspo_cli.rewards.judges.entry import judge_reward
from gspo_cli.train.step.rewards import WeightedRewards

PROMPTS = ["Q1", "Q1", "Q2", "Q2"]
COMPLETIONS = ["good answer", "bad", "good one", "meh"]


class Stub(BaseHTTPRequestHandler):
    """/ok: `Score: 9` for a response holding `good`, else `Score: 2`; /group: JSON scores, 8
    for `good` members; /garbage: prose; /broken: not JSON; /hang: sleeps past any timeout;
    /trickle: answers a byte at a time."""

    requests: typing.ClassVar[list[str]] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        text = body["messages"][0]["content"]
        Stub.requests.append(self.path)
        kind = self.path.split("/")[1]
        if kind == "hang":
            time.sleep(3)
            return
        if kind == "trickle":  # a byte every 0.1 s: each read is quick, the answer is not
            self.send_response(200)
            self.send_header("Content-Length", "30")
            self.end_headers()
            for _ in range(30):
                self.wfile.write(b" ")
                self.wfile.flush()
                time.sleep(0.1)
            return
        if kind == "broken":
            self._send(b"<html>oops</html>")
            return
        reply = {
            "ok": lambda: "Score: 9" if "Response:\ngood" in text else "Score: 2",
            "group": lambda: json.dumps(
                {
                    "scores": [
                        8 if m.startswith("good") else 1 for m in re.findall(r"\[\d+\] (\w+)", text)
                    ]
                }
            ),
            "garbage": lambda: "What a lovely response, I have no number for it.",
        }[kind]()
        self._send(json.dumps({"choices": [{"message": {"content": reply}}]}).encode())

    def _send(self, data: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:  # quiet
        pass


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Stub)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture(autouse=True)
def fresh() -> Iterator[None]:
    Stub.requests.clear()
    judge_cache._OPEN.clear()  # each test its own process-wide caches
    yield


def judge(context: RewardContext, completions: list[str] = COMPLETIONS, **options: Any) -> Any:
    return judge_reward(completions, PROMPTS[: len(completions)], reward_context=context, **options)


def test_pointwise_scores_map_onto_0_1_and_the_cache_answers_again(server: str) -> None:
    context = RewardContext(device="cpu")
    scores = judge(context, model=f"{server}/ok/v1", max_concurrency=2)
    assert scores == [0.9, 0.2, 0.9, 0.2]
    assert len(Stub.requests) == 4 and Stub.requests[0] == "/ok/v1/chat/completions"
    assert judge(context, model=f"{server}/ok/v1") == scores
    assert len(Stub.requests) == 4  # all four from the cache
    counts = context.drain()
    assert counts["judge/calls"] == 4 and counts["judge/cache_hits"] == 4
    assert counts["judge/parse_failures"] == 0 and counts["judge/errors"] == 0


def test_the_disk_cache_serves_a_resumed_run(server: str, tmp_path: Path) -> None:
    path = tmp_path / "judge_cache.jsonl"
    judge(RewardContext(path, "cpu"), model=f"{server}/ok/v1")
    assert len(JudgeCache(path)) == 4 and len(Stub.requests) == 4
    judge_cache._OPEN.clear()  # a new process: only the file remains
    again = RewardContext(path, "cpu")
    assert judge(again, model=f"{server}/ok/v1") == [0.9, 0.2, 0.9, 0.2]
    assert len(Stub.requests) == 4
    other = judge(again, model=f"{server}/ok/v1", template="Response:\n{completion}\n{prompt}")
    assert other == [0.9, 0.2, 0.9, 0.2] and len(Stub.requests) == 8  # another template: asked


def test_group_mode_asks_once_per_group(server: str) -> None:
    context = RewardContext(device="cpu")
    scores = judge(context, model=f"{server}/group/v1", mode="group")
    assert scores == [0.8, 0.1, 0.8, 0.1]
    assert len(Stub.requests) == 2  # Q1's two responses, then Q2's


def test_garbage_is_counted_and_scored_by_the_declared_rule(server: str) -> None:
    context = RewardContext(device="cpu")
    assert judge(context, model=f"{server}/garbage/v1") == [None] * 4
    assert context.drain()["judge/parse_failures"] == 4
    assert judge(context, model=f"{server}/garbage/v1", on_parse_failure=0.25) == [0.25] * 4
    group = judge(context, model=f"{server}/ok/v1", mode="group", parse="json:scores")
    assert group == [None] * 4  # `Score: 9` holds no JSON
    counts = context.drain()
    assert counts["judge/parse_failures"] == 8 and counts["judge/scored"] == 8


def test_a_judge_that_never_parses_is_said_on_the_step_line_and_warned_of(server: str) -> None:
    """Never a silent zero: the unparsed share on the step line, and a warning (once) after
    steps in a row where most replies did not parse."""
    from gspo_cli.train.run.console import live_line
    from gspo_cli.train.run.guard import Guard

    context = RewardContext(device="cpu")
    judge(context, model=f"{server}/garbage/v1", on_parse_failure=0.0)
    judge(context, model=f"{server}/ok/v1", completions=COMPLETIONS[:2])
    step = {"reward_mean": 0.1, **context.drain()}
    assert live_line(step) == "reward 0.100  judge unparsed 67%"
    guard = Guard(3, "stop", 0)
    lines = [guard.notices(n, step) for n in range(1, 6)]
    assert lines[:2] == [[], []] and lines[3:] == [[], []]
    assert lines[2] == [
        "warning: steps 1-3: more than 50% of the judge's replies did not parse (67% at step 3), "
        "so those rewards are on_parse_failure's, not the judge's; check the judge's parse "
        "rule and template against its replies (docs/judges.md)"
    ]
    healthy = {"reward_mean": 0.5, "judge/parse_failures": 0.0, "judge/scored": 4.0}
    assert live_line(healthy) == "reward 0.500"
    assert all(Guard(3, "stop", 0).notices(n, healthy) == [] for n in range(1, 6))


def test_a_hanging_server_times_out_and_is_counted(server: str) -> None:
    context = RewardContext(device="cpu")
    started = time.perf_counter()
    scores = judge(context, model=f"{server}/hang/v1", timeout_s=0.5, on_error="skip")
    assert scores == [None] * 4
    assert time.perf_counter() - started < 2.5  # four calls in parallel, each cut at 0.5 s
    assert context.drain()["judge/errors"] == 4
    with pytest.raises(ValueError, match=r"judge .*/hang/v1: no answer within timeout_s 0.5s"):
        judge(context, model=f"{server}/hang/v1", timeout_s=0.5)


def test_a_server_trickling_its_answer_is_cut_at_one_deadline(server: str) -> None:
    context = RewardContext(device="cpu")
    started = time.perf_counter()
    scores = judge(context, ["good"], model=f"{server}/trickle/v1", timeout_s=0.5, on_error="skip")
    assert scores == [None] and context.drain()["judge/errors"] == 1
    assert time.perf_counter() - started < 2.5  # the trickle lasts 3 s


def test_a_broken_answer_is_an_error_not_a_parse_failure(server: str) -> None:
    context = RewardContext(device="cpu")
    assert judge(context, model=f"{server}/broken/v1", on_error="skip") == [None] * 4
    counts = context.drain()
    assert counts["judge/errors"] == 4 and counts["judge/parse_failures"] == 0


def refused_url() -> str:
    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


def test_a_refused_connection_ends_the_run_as_one_line_with_on_error_fail() -> None:
    url = refused_url()
    entry = RewardFunctionConfig(name="judge", options={"model": url}, none_as="skip")
    reward = WeightedRewards(RewardConfig(functions=[entry]), RewardServices())
    rows = [{"prompt": p} for p in PROMPTS]
    with pytest.raises(GspoError, match=rf"judge {re.escape(url)}: cannot reach it") as info:
        reward(COMPLETIONS, rows)
    assert "\n" not in str(info.value)


def test_skipped_scores_are_left_out_and_counts_are_step_metrics(server: str) -> None:
    entries = [
        RewardFunctionConfig(name="judge", options={"model": f"{server}/ok/v1"}, none_as="skip"),
        RewardFunctionConfig(
            name="judge",
            options={"model": f"{server}/garbage/v1", "on_parse_failure": "skip"},
            none_as="skip",
            weight=2.0,
        ),
    ]
    reward = WeightedRewards(RewardConfig(functions=entries), RewardServices())
    out = reward(COMPLETIONS, [{"prompt": p} for p in PROMPTS])
    assert out.totals == pytest.approx([0.9, 0.2, 0.9, 0.2])  # the garbage judge adds nothing
    assert out.metrics["judge/parse_failures"] == 4 and out.metrics["judge/calls"] == 8
    assert "reward/judge#2/mean" not in out.metrics  # it scored nothing
    again = reward(COMPLETIONS, [{"prompt": p} for p in PROMPTS])
    assert again.metrics["judge/cache_hits"] == 4  # counts are per step, not cumulative


def test_builtin_rules() -> None:
    context = RewardContext(device="cpu")
    answers = ["the answer is 42", "42", None, "x"]
    overlap = judge_reward(
        ["The answer is 42.", "it is 42", "", "y"][:2],
        PROMPTS[:2],
        model="builtin:overlap",  # type: ignore[arg-type]
        reward_context=context,
        answer=answers[:2],
    )
    assert overlap == [1.0, pytest.approx(2 * (1 / 3) * 1 / (1 / 3 + 1))]
    length = judge(context, ["word " * 50, "word " * 150], model="builtin:length")
    assert length == [0.5, 1.0]
    with pytest.raises(ValueError, match="builtin:overlap needs the reference answer"):
        judge(context, ["a"], model="builtin:overlap")


@pytest.mark.parametrize(
    ("options", "none_as", "message"),
    [
        ({"model": "builtin:nope"}, None, "unknown built-in judge 'builtin:nope'"),
        ({"model": "http//x"}, None, "cannot load a judge model from 'http//x'"),
        ({"model": "builtin:length", "template": "Rate {prompt}"}, None, "lacks {completion}"),
        (
            {"model": "builtin:length", "mode": "group", "template": "{prompt} {completion}"},
            None,
            "group judge template lacks {completions}",
        ),
        ({"model": "builtin:length", "parse": r"\d+"}, None, "has 0 groups; it needs one"),
        ({"model": "builtin:length", "parse": "json:"}, None, "needs a field name"),
        ({"model": "builtin:length", "score_range": [5, 1]}, None, "must rise"),
        ({"model": "http://h:1/v1"}, None, "set none_as: skip on this entry"),
        ({"model": "http://h:1/v1", "timeout_s": 0}, "skip", "greater than 0"),
    ],
)
def test_bad_options_are_refused_when_the_recipe_loads(
    options: dict[str, Any], none_as: Any, message: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        RewardFunctionConfig(name="judge", options=options, none_as=none_as)


def test_a_good_entry_loads() -> None:
    entry = RewardFunctionConfig(
        name="judge", options={"model": "http://h:1/v1", "on_parse_failure": 0.0}
    )
    assert entry.options["on_parse_failure"] == 0.0


def test_a_local_causal_lm_judges_greedily(tmp_path: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config

    from gspo_cli.models.tokenizer import build_char_tokenizer

    tokenizer = build_char_tokenizer()
    config = Qwen3Config(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=2048,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
    )  # fmt: skip
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "lm")
    tokenizer.save_pretrained(tmp_path / "lm")
    RewardFunctionConfig(name="judge", options={"model": str(tmp_path / "lm")}, none_as="skip")
    context = RewardContext(device="cpu")
    options = {"model": str(tmp_path / "lm"), "max_new_tokens": 8, "parse": r"(\d)"}
    first = judge(context, **options)
    failures = context.drain()["judge/parse_failures"]
    judge_cache._OPEN.clear()
    second = judge(RewardContext(device="cpu"), **options)
    assert first == second  # greedy: the same replies
    assert failures == sum(s is None for s in first)  # every unparsed reply counted


def test_a_two_step_run_logs_both_judges(tmp_path: Path) -> None:
    from tests.support.helpers import run_cli, write_recipe

    overlap = {"name": "judge", "options": {"model": "builtin:overlap"}}
    recipe = write_recipe(
        tmp_path,
        {
            "trainer": {"steps": 2, "out_dir": str(tmp_path / "runs")},
            "reward": {
                "functions": [{"name": "math"}, overlap],
                "heldout_judge": {"every": 1, "options": {"model": "builtin:length"}},
            },
        },
    )
    out = tmp_path / "run"
    result = run_cli("train", str(recipe), "--out", str(out), timeout=120)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    steps = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [1, 2]
    for step in steps:
        for key in ("judge_train/mean", "judge_heldout/mean", "reward/judge/mean"):
            assert 0.0 <= step[key] <= 1.0, key
        assert step["judge/parse_failures"] == 0 and step["judge/errors"] == 0


def test_judge_counts_add_up_over_ranks() -> None:
    from gspo_cli.train.engines.metric_rules import combine

    for key in (
        "judge/parse_failures",
        "judge/errors",
        "judge/calls",
        "judge/cache_hits",
        "judge/scored",
    ):
        assert combine(key, [1.0, 2.0], [10.0, 10.0]) == 3.0
