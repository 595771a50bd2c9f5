"""`gspo train` with rollout.tools end to end: a tiny model cold-started on solutions that
compute in a ```python block calls the interpreter while it trains; a killed run resumes
record for record; bad tool settings are one line at validate time."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from gspo_cli.recipe import deep_merge
from tests.support.helpers import (
    cold_start,
    gspo_train,
    invoke_cli,
    one_error_line,
    run_cli,
    shared_root,
    train_until_checkpoint,
    write_recipe,
)

TOOL_TASK = {
    "data": {"arithmetic": {"tool_rate": 1.0, "unboxed_rate": 0.0}},
    "rollout": {"max_new_tokens": 64, "tools": {"output_max_tokens": 16, "max_calls": 2}},
}


@pytest.fixture(scope="module")
def tool_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny model that has seen only solutions computed with the interpreter."""
    cold = {"cold_start": {"enabled": True, "steps": 200, "lr": 3e-3, "batch_size": 16}}
    return cold_start(shared_root(tmp_path_factory), deep_merge(TOOL_TASK, cold))


def tool_recipe(folder: Path, checkpoint: Path, **overrides: object) -> Path:
    base = deep_merge(TOOL_TASK, {"model": {"path": str(checkpoint)}})
    return write_recipe(folder, deep_merge(base, overrides))


def records(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.slow
def test_training_calls_the_interpreter_and_logs_it(tool_checkpoint: Path, tmp_path: Path) -> None:
    recipe = tool_recipe(tmp_path, tool_checkpoint, trainer={"steps": 2})
    result = run_cli("train", str(recipe), "--out", str(tmp_path / "run"))
    assert result.returncode == 0, result.stderr[-2000:]
    metrics = records(tmp_path / "run" / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2]
    assert all(float(m["tool_calls_per_response"]) > 0.5 for m in metrics)  # type: ignore[arg-type]
    for key in ("tool_error_frac", "tool_time_s", "tool_budget_ended_frac", "tool_outputs_cut"):
        assert key in metrics[0]
    texts = [str(s["completion"]) for s in records(tmp_path / "run" / "samples.jsonl")]
    assert any("```output\n" in t for t in texts)  # the sandbox's answers are in the responses
    assert "calls " in result.stdout  # the console line shows calls per response


@pytest.mark.slow
def test_a_killed_tool_run_resumes_record_for_record(tool_checkpoint: Path, tmp_path: Path) -> None:
    recipe = tool_recipe(tmp_path, tool_checkpoint, trainer={"steps": 4, "checkpoint_every": 2})
    straight = tmp_path / "straight"
    assert run_cli("train", str(recipe), "--out", str(straight)).returncode == 0
    killed = tmp_path / "killed"
    proc = train_until_checkpoint(recipe, killed)
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL, "the run ended before it could be killed"
    result = run_cli("train", str(recipe), "--out", str(killed), "--resume")
    assert result.returncode == 0, result.stderr[-2000:]
    a, b = records(straight / "samples.jsonl"), records(killed / "samples.jsonl")
    key = ("step", "completion", "reward")
    assert [tuple(r[k] for k in key) for r in a] == [tuple(r[k] for k in key) for r in b]
    calls = [m["tool_calls_per_response"] for m in records(killed / "metrics.jsonl")]
    assert calls == [m["tool_calls_per_response"] for m in records(straight / "metrics.jsonl")]


@pytest.mark.parametrize(
    "tools,expected",
    [
        ({"functions": ["json:dumps"]}, "needs format: chat_template"),
        ({"format": "chat_template", "functions": ["no_such_module_x:f"]}, "no_such_module_x"),
        ({"interpreter": None}, "nothing to call"),
        ({"max_calls": -1}, "max_calls"),
        ({"output_max_tokens": 64}, "output_max_tokens"),
        ({"format": "chat_template", "data_none": True}, "data.chat_template none"),
    ],
)
def test_bad_tool_settings_are_one_line_at_validate_time(
    tools: dict[str, object], expected: str, tmp_path: Path
) -> None:
    tools = dict(tools)
    data = {"chat_template": "none"} if tools.pop("data_none", False) else {}
    overrides = {"rollout": {"tools": tools}, "data": data}
    recipe = write_recipe(tmp_path, deep_merge(TOOL_TASK, overrides))
    result = invoke_cli("validate", str(recipe))
    assert result.returncode == 2
    assert expected in one_error_line(result)


def metric(run: Path, key: str) -> list[float]:
    return [float(m[key]) for m in records(run / "metrics.jsonl")]  # type: ignore[arg-type]


@pytest.mark.slow
def test_two_deepspeed_processes_train_the_tool_run_one_does(
    tool_checkpoint: Path, tmp_path: Path
) -> None:
    pytest.importorskip("deepspeed")
    recipe = tool_recipe(
        tmp_path,
        tool_checkpoint,
        trainer={"steps": 2},
        algorithm={"minibatches": 2},
        rollout={"seed_per_prompt": True, "dynamic_sampling": True},
    )
    one = gspo_train(recipe, "--out", str(tmp_path / "one"))
    assert one.returncode == 0, one.stderr[-2000:]
    two = ("--set", "trainer.engine=deepspeed", "--set", "deepspeed.zero_stage=2", "--nproc", "2")
    result = run_cli("train", str(recipe), "--out", str(tmp_path / "two"), *two)
    assert result.returncode == 0, result.stderr[-2000:]
    for key in ("loss", "grad_norm", "reward_mean", "tool_calls_per_response", "tool_error_frac"):
        a, b = metric(tmp_path / "one", key), metric(tmp_path / "two", key)
        assert b == pytest.approx(a, rel=1e-4, abs=1e-6), key
    assert min(metric(tmp_path / "one", "tool_calls_per_response")) > 0.5


@pytest.mark.parametrize(
    "overrides",
    [
        {"rollout": {"max_staleness": 1}},  # asynchronous rollouts: the worker runs the tools
        {"model": {"lora": {"r": 4, "target_modules": ["q_proj", "v_proj"]}}},
        {"algorithm": {"sequence_unit": "turn", "name": "gspo_token"}},
    ],
    ids=["async", "lora", "turn"],
)
@pytest.mark.slow
def test_tool_runs_train_async_with_lora_and_per_turn(
    overrides: dict[str, object], tool_checkpoint: Path, tmp_path: Path
) -> None:
    recipe = tool_recipe(tmp_path, tool_checkpoint, trainer={"steps": 2}, **overrides)
    result = run_cli("train", str(recipe), "--out", str(tmp_path / "run"))
    assert result.returncode == 0, result.stderr[-2000:]
    assert min(metric(tmp_path / "run", "tool_calls_per_response")) > 0.5
    assert all(x == x for x in metric(tmp_path / "run", "loss"))  # finite, not NaN


def test_eval_with_the_recipe_answers_with_the_same_tools(
    tool_checkpoint: Path, tmp_path: Path
) -> None:
    data = tmp_path / "problems.jsonl"
    rows = [{"id": f"p{i}", "question": f"Compute {i}+{i + 3}.", "answer": str(2 * i + 3)}
            for i in range(4)]  # fmt: skip
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    recipe = tool_recipe(tmp_path, tool_checkpoint)
    out = tmp_path / "ev"
    result = run_cli(
        "eval", str(tool_checkpoint), "--benchmark", "custom", "--data", str(data),
        "--recipe", str(recipe), "--samples", "2", "--max-new-tokens", "64", "--out", str(out),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    samples = records(out / "samples.jsonl")
    calls = [c for s in samples for c in s["tool_calls"]]  # type: ignore[attr-defined]
    assert sum(calls) > 0 and all(c <= 2 for c in calls)  # rollout.tools.max_calls
    texts = [t for s in samples for t in s["completions"]]  # type: ignore[attr-defined]
    assert any("```output\n" in t for t in texts)
