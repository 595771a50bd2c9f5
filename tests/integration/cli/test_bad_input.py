"""Bad input and a hostile disk: one line naming the problem, exit 2, nothing lost, and a failed
start never blocks its rerun."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import resource
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from gspo_cli.models import load_policy
from gspo_cli.recipe import deep_merge
from gspo_cli.runs.folder import RUN_MARKER
from gspo_cli.runs.marker import RUN, mark_folder
from tests.support.helpers import REPO, invoke_cli, one_error_line, write_recipe

GSM8K = Path("benchmarks") / "gsm8k" / "qwen25math_gsm8k_test.jsonl"
QUICK = {"model": {"path": "builtin:tiny-dense"}, "trainer": {"steps": 1}}


def _recipe(tmp_path: Path, **overrides: object) -> Path:
    return write_recipe(tmp_path, deep_merge(QUICK, overrides))


@pytest.fixture(scope="module")
def hf_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("model")
    model, tokenizer = load_policy("builtin:tiny-dense")
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def _eval_args(checkpoint: Path, out: Path, shared: Path) -> list[str]:
    return [
        "eval", str(checkpoint), "--benchmark", "gsm8k", "--data", str(shared / GSM8K),
        "--limit", "2", "--samples", "1", "--max-new-tokens", "4", "--out", str(out),
    ]  # fmt: skip


def test_eval_of_truncated_weights_is_one_line_and_the_rerun_is_not_blocked(
    hf_model: Path, tmp_path: Path, shared: Path
) -> None:
    broken = tmp_path / "broken"
    broken.mkdir()
    for file in hf_model.iterdir():
        (broken / file.name).write_bytes(file.read_bytes())
    weights = broken / "model.safetensors"
    os.truncate(weights, weights.stat().st_size // 2)
    out = tmp_path / "eval"
    one_error_line(
        invoke_cli(*_eval_args(broken, out, shared)), "checkpoint:", "damaged or truncated"
    )
    result = invoke_cli(*_eval_args(hf_model, out, shared))  # same --out, no --resume
    assert result.returncode == 0, result.stderr[-3000:]
    assert (out / "results.json").is_file()


def test_out_pointing_at_a_file(hf_model: Path, tmp_path: Path, shared: Path) -> None:
    file = tmp_path / "a-file"
    file.write_text("keep me\n")
    one_error_line(invoke_cli(*_eval_args(hf_model, file, shared)), "is a file")
    recipe = _recipe(tmp_path)
    one_error_line(invoke_cli("train", str(recipe), "--out", str(file)), "is a file")
    one_error_line(invoke_cli("sft", str(recipe), "--out", str(file)), "is a file")
    assert file.read_text() == "keep me\n"


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        ("{question}\\nAnswer in \\\\boxed{{}}.", "unknown field {question}"),
        ("{prompt}\\nPut the answer in \\\\boxed{}.", "unknown field {}"),
        ("{prompt} and a { alone", "bad brace"),
        ("No question here.", "must contain {prompt}"),
    ],
)
def test_validate_catches_a_bad_prompt_template(
    tmp_path: Path, template: str, expected: str
) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f'data:\n  prompt_template: "{template}"\n')
    one_error_line(invoke_cli("validate", str(recipe)), "data.prompt_template", expected)


def test_a_model_folder_without_config_json(hf_model: Path, tmp_path: Path) -> None:
    folder = tmp_path / "weights-only"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes((hf_model / "model.safetensors").read_bytes())
    recipe = _recipe(tmp_path, model={"path": str(folder)})
    for command in ("validate", "train"):
        one_error_line(invoke_cli(command, str(recipe)), "model.path", "without config.json")


def _write_then_fail(written: list[Path]):  # type: ignore[no-untyped-def]
    """torch.save that writes part of its file, then meets a full disk."""

    def save(obj: object, path: object, *args: object, **kwargs: object) -> None:
        Path(str(path)).write_bytes(b"\0" * 1024)
        written.append(Path(str(path)))
        raise OSError(errno.ENOSPC, "No space left on device")

    return save


def test_a_full_disk_during_a_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    recipe = _recipe(tmp_path, trainer={"steps": 2, "checkpoint_every": 1})
    out = tmp_path / "run"
    written: list[Path] = []
    monkeypatch.setattr(torch, "save", _write_then_fail(written))
    result = invoke_cli("train", str(recipe), "--out", str(out))
    root = out / "checkpoints"
    one_error_line(
        result, f"no space left on {root}", "step_000001 not saved (there is no earlier checkpoint)"
    )
    assert written and written[0].parent.name == ".step_000001.tmp"  # the save had begun
    assert list(root.iterdir()) == []  # the half-written folder is gone at once
    assert [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()] == [1]


@pytest.mark.slow
def test_a_file_size_limit_during_a_checkpoint_keeps_the_last_one(tmp_path: Path) -> None:
    """`ulimit -f` reached by a checkpoint's weights (safetensors wraps the EFBIG): one line,
    the earlier checkpoint intact, and the run resumes from it once the limit is lifted."""
    recipe = _recipe(tmp_path, trainer={"steps": 2, "checkpoint_every": 1})
    out = tmp_path / "run"
    first = invoke_cli("train", str(recipe), "--out", str(out), "--set", "trainer.steps=1")
    assert first.returncode == 0, first.stderr[-3000:]

    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (300 * 1024, resource.RLIM_INFINITY))

    root = out / "checkpoints"
    command = [sys.executable, "-m", "gspo_cli.cli", "train", str(recipe), "--out", str(out)]
    result = subprocess.run(
        [*command, "--resume"],
        capture_output=True,
        text=True,
        cwd=REPO,
        preexec_fn=limited,
        timeout=300,
    )
    one_error_line(
        result,
        f"cannot write in {root}: a file reached the file size limit (ulimit -f)",
        "checkpoint step_000002 not saved",
    )
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step_000001"]
    again = invoke_cli("train", str(recipe), "--out", str(out), "--resume")
    assert again.returncode == 0, again.stderr[-3000:]
    assert (root / "latest").read_text().strip() == "step_000002"


def test_a_full_disk_while_saving_the_cold_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from transformers import PreTrainedTokenizerBase

    def full(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    recipe = _recipe(tmp_path, cold_start={"enabled": True, "steps": 2, "batch_size": 4})
    out = tmp_path / "run"
    with monkeypatch.context() as patch:
        patch.setattr(PreTrainedTokenizerBase, "save_pretrained", full)
        result = invoke_cli("train", str(recipe), "--out", str(out))
    one_error_line(result, f"no space left on {out}: the cold start was not saved")
    assert not (out / ".cold_start.tmp").exists() and not (out / "cold_start").exists()
    rerun = invoke_cli("train", str(recipe), "--out", str(out))  # nothing to keep: no --resume
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert (out / "cold_start" / "config.json").is_file()


@contextlib.contextmanager
def _read_only(folder: Path) -> Iterator[str]:
    """Make `folder` read-only: a read-only tmpfs as root (root ignores modes), else chmod.
    Yields the words the error line must contain."""
    if os.geteuid() != 0:
        folder.chmod(0o555)
        try:
            yield "permission denied"
        finally:
            folder.chmod(0o755)
        return
    snapshot = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(folder)])
    if mounted.returncode != 0:
        pytest.skip("cannot make a read-only folder here (root, and mount is not allowed)")
    try:
        for name, data in snapshot.items():
            (folder / name).write_bytes(data)
        subprocess.run(["mount", "-o", "remount,ro", str(folder)], check=True)
        yield "read-only file system"
    finally:
        subprocess.run(["umount", str(folder)], check=True)


def test_a_read_only_run_folder(tmp_path: Path) -> None:
    recipe = _recipe(tmp_path)
    out = tmp_path / "run"
    mark_folder(out, RUN)  # a run folder of ours, stopped before its first step
    (out / "recipe.yaml").write_text(recipe.read_text())
    with _read_only(out) as reason:
        resumed = invoke_cli("train", str(recipe), "--out", str(out), "--resume")
        one_error_line(resumed, f"cannot write in {out}: {reason}")
        fresh = invoke_cli("train", str(recipe), "--out", str(out / "new"))
        one_error_line(fresh, f"{out / 'new'}: {reason}")


def test_resume_without_a_checkpoint_says_it_starts_from_step_0(tmp_path: Path) -> None:
    out = tmp_path / "run"
    mark_folder(out, RUN)  # a run folder of ours with no checkpoint yet
    result = invoke_cli("train", str(_recipe(tmp_path)), "--out", str(out), "--resume")
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"no checkpoint in {out / 'checkpoints'}: starting from step 0" in result.stdout


def _rows_file(tmp_path: Path) -> Path:
    path = tmp_path / "rows.jsonl"
    rows = [{"prompt": f"What is {i} + 2?", "answer": str(i + 2)} for i in range(40)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("rerun_flags", [[], ["--resume"]])
def test_a_failed_start_never_blocks_its_rerun(tmp_path: Path, rerun_flags: list[str]) -> None:
    data = {"source": str(_rows_file(tmp_path)), "prompt_template": "{prompt}"}
    recipe = _recipe(tmp_path, data=data, eval={"num_problems": 8, "samples": 1})
    out = tmp_path / "run"
    failed = invoke_cli("train", str(recipe), "--out", str(out), "--set", "data.answer_column=nope")
    one_error_line(failed, "column 'nope'")
    assert (out / "recipe.yaml").is_file()  # what the failed start left
    rerun = invoke_cli("train", str(recipe), "--out", str(out), *rerun_flags)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "held-out: 8 prompts of " in rerun.stdout  # a file has no held-out split: carved


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"chat_template": "none", "system_prompt": "Hi"}, "data: system_prompt needs a chat"),
        ({"chat_template_kwargs": {"tokenize": True}}, "data.chat_template_kwargs: 'tokenize'"),
        ({"chat_template": "chatml"}, "data.chat_template: Input should be 'auto', 'none' or"),
    ],
)
def test_validate_catches_bad_chat_settings(
    tmp_path: Path, data: dict[str, object], expected: str
) -> None:
    one_error_line(invoke_cli("validate", str(_recipe(tmp_path, data=data))), expected)


def _conversations(tmp_path: Path, bad_role: str) -> Path:
    path = tmp_path / "chats.jsonl"
    rows = [
        {"messages": [{"role": "user", "content": f"What is {i} + 2?"}], "answer": str(i + 2)}
        for i in range(40)
    ]
    rows[7]["messages"][0]["role"] = bad_role
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_an_unknown_role_stops_training_in_one_line_before_any_step(tmp_path: Path) -> None:
    data = {"source": str(_conversations(tmp_path, "bot")), "prompt_column": "messages"}
    out = tmp_path / "run"
    result = invoke_cli("train", str(_recipe(tmp_path, data=data)), "--out", str(out))
    one_error_line(result, "chats.jsonl row 7: turn 0 has role 'bot'; known: system, user")
    assert sorted(p.name for p in out.iterdir()) == [RUN_MARKER, "recipe.yaml"]  # no step


def test_a_tokenizer_without_a_chat_template_is_one_line(hf_model: Path, tmp_path: Path) -> None:
    model, tokenizer = load_policy(str(hf_model))
    tokenizer.chat_template = None
    folder = tmp_path / "base-model"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    recipe = _recipe(tmp_path, model={"path": str(folder)})
    result = invoke_cli("train", str(recipe), "--out", str(tmp_path / "run"))
    one_error_line(result, "the tokenizer has no chat template: set data.chat_template: none")


TOOLS = '''
def add(a: int, b: int) -> int:
    """Add two numbers.

    Args:
        a: The first.
        b: The second.
    """
    return a + b
'''
CHAT_TEMPLATE_TOOLS = {
    "format": "chat_template",
    "interpreter": None,
    "functions": ["bad_input_tools:add"],
}


@pytest.mark.parametrize(
    ("overrides", "args", "expected"),  # the first two are known to `gspo validate` too
    [
        (
            {
                "model": {"path": "builtin:tiny-moe"},
                "trainer": {"engine": "deepspeed"},
                "deepspeed": {"zero_stage": 2, "expert_parallel": 3},
            },
            ["--nproc", "3"],
            "deepspeed.expert_parallel (3) must divide the model's expert count (8): builtin:tiny",
        ),
        (  # the built-in ChatML renders no tool calls
            {"rollout": {"max_new_tokens": 128, "tools": CHAT_TEMPLATE_TOOLS}},
            [],
            "rollout.tools.format: the chat template of builtin:tiny-dense does not render",
        ),
        ({}, ["--nproc", "2"], "--nproc/--hostfile need trainer.engine"),  # a launch refusal
    ],
    ids=["expert-count", "tool-template", "launch"],
)
def test_refused_before_a_run_folder_is_made(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    overrides: dict[str, object],
    args: list[str],
    expected: str,
) -> None:
    (tmp_path / "bad_input_tools.py").write_text(TOOLS)
    monkeypatch.chdir(tmp_path)
    recipe, out = _recipe(tmp_path, **overrides), tmp_path / "run"
    if "--nproc/--hostfile" not in expected:  # what only a launch knows
        one_error_line(invoke_cli("validate", str(recipe)), expected)
    one_error_line(invoke_cli("train", str(recipe), "--out", str(out), *args), expected)
    assert not out.exists()  # no empty run folder left behind
