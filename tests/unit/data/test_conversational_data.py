"""TRL's data formats through the real loader: conversational prompts, `messages` split into prompt
and cold-start target, system prompts, chat-template variables, a tokenizer without a template,
and answers that are null, numbers or structures."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from transformers import PreTrainedTokenizerBase

from gspo_cli.core.errors import GspoError
from gspo_cli.data.benchmarks import load_benchmark
from gspo_cli.data.prompts import render_prompt
from gspo_cli.eval.runner import EvalSettings, run_eval
from gspo_cli.models.tokenizer import CHAT_TEMPLATE, build_char_tokenizer
from gspo_cli.recipe import Recipe
from gspo_cli.rewards.math_verifier import MathVerifierPool
from gspo_cli.rollout.base import SamplingParams
from gspo_cli.train.run.heldout import heldout_accuracy
from gspo_cli.train.run.problem_sets import (
    Problems,
    eval_format,
    load_problems,
    run_problems,
    training_rows,
)
from gspo_cli.train.run.sft import cold_start
from tests.support.fixed_engine import FixedRolloutEngine

SYSTEM, USER, ASSISTANT = "system", "user", "assistant"
# ChatML with Qwen3's switch: a closed think block when enable_thinking is false.
THINKING_TEMPLATE = CHAT_TEMPLATE.replace(
    "{{ '<|im_start|>assistant\n' }}",
    "{{ '<|im_start|>assistant\n' }}"
    "{% if enable_thinking is defined and not enable_thinking %}{{ '<think></think>' }}{% endif %}",
)


def _turn(role: str, content: str) -> dict[str, str]:
    return {"role": role, "content": content}


def _chatml(*turns: tuple[str, str]) -> str:
    """What the built-in ChatML template writes for these turns, assistant turn opened."""
    body = "".join(f"<|im_start|>{role}\n{content}<|im_end|>\n" for role, content in turns)
    return body + "<|im_start|>assistant\n"


def _write(path: Path, rows: list[dict[str, Any]]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _recipe(
    tmp_path: Path, rows: list[dict[str, Any]], rewards: tuple[str, ...] = ("math",), **data: Any
) -> Recipe:
    """A recipe training on `rows` with a held-out file of its own (no carving)."""
    held = [{"prompt": "What is 1 + 1?", "answer": "2"}]
    return Recipe.model_validate(
        {
            "data": {
                "source": _write(tmp_path / "train.jsonl", rows),
                "eval_source": _write(tmp_path / "held.jsonl", held),
                **data,
            },
            "reward": {"functions": [{"name": name} for name in rewards]},
            "eval": {"num_problems": 1, "samples": 1},
        }
    )


@pytest.fixture
def tokenizer() -> PreTrainedTokenizerBase:
    return build_char_tokenizer()


def _texts(tokenizer: PreTrainedTokenizerBase, problems: Problems) -> list[str]:
    return [tokenizer.decode(ids) for ids in problems.prompts]


def test_a_conversational_prompt_is_rendered_as_it_is(
    tmp_path: Path, tokenizer: PreTrainedTokenizerBase
) -> None:
    prompt = [_turn(SYSTEM, "Answer tersely."), _turn(USER, "What is 3 + 4?")]
    recipe = _recipe(tmp_path, [{"prompt": prompt, "answer": "7"}])
    train = load_problems(recipe, tokenizer, "train")
    expected = _chatml((SYSTEM, "Answer tersely."), (USER, "What is 3 + 4?"))
    assert _texts(tokenizer, train) == [expected]  # system kept, no \boxed{} instruction added
    assert train.prompts[0] == list(tokenizer(expected, add_special_tokens=False)["input_ids"])
    assert train.rows[0]["prompt"] == prompt and train.rows[0]["answer"] == "7"


def test_a_plain_prompt_keeps_the_template(
    tmp_path: Path, tokenizer: PreTrainedTokenizerBase
) -> None:
    recipe = _recipe(tmp_path, [{"prompt": "What is 3 + 4?", "answer": "7"}])
    [text] = _texts(tokenizer, load_problems(recipe, tokenizer, "train"))
    assert text == _chatml((USER, "What is 3 + 4?\nPut the final answer in \\boxed{}."))


def test_a_template_of_ones_own_goes_into_the_last_user_turn(
    tmp_path: Path, tokenizer: PreTrainedTokenizerBase
) -> None:
    prompt = [_turn(USER, "Hi"), _turn(ASSISTANT, "Hello."), _turn(USER, "What is 3 + 4?")]
    recipe = _recipe(tmp_path, [{"prompt": prompt, "answer": "7"}], prompt_template="Q: {prompt}")
    [text] = _texts(tokenizer, load_problems(recipe, tokenizer, "train"))
    assert text == _chatml((USER, "Hi"), (ASSISTANT, "Hello."), (USER, "Q: What is 3 + 4?"))


def test_messages_are_split_into_prompt_and_cold_start_target(
    tmp_path: Path, tokenizer: PreTrainedTokenizerBase
) -> None:
    worked = "3+4=7\n\\boxed{7}"
    messages = [_turn(USER, "What is 3 + 4?"), _turn(ASSISTANT, worked)]
    rows = [{"messages": messages, "answer": "7", "solution": "stale column"}]
    recipe = _recipe(tmp_path, rows, prompt_column="messages")
    train = load_problems(recipe, tokenizer, "train")
    [text] = _texts(tokenizer, train)
    assert text == _chatml((USER, "What is 3 + 4?"))  # the default template: plain prompts only
    assert "3+4=7" not in text  # the answer is the target, never part of the prompt
    assert train.rows[0]["solution"] == worked  # the final assistant turn wins over the column
    assert train.rows[0]["prompt"] == messages[:1]


def test_cold_start_imitates_the_split_target(
    tmp_path: Path, tokenizer: PreTrainedTokenizerBase, monkeypatch: pytest.MonkeyPatch
) -> None:
    messages = [_turn(USER, "What is 3 + 4?"), _turn(ASSISTANT, "\\boxed{7}")]
    recipe = _recipe(
        tmp_path, [{"messages": messages, "answer": "7"}], prompt_column="messages",
        prompt_template="{prompt}",
    )  # fmt: skip
    train = load_problems(recipe, tokenizer, "train")
    targets: list[str] = []

    def encode(tok: Any, prompt_ids: list[int], solution: str) -> tuple[list[int], list[int]]:
        targets.append(tok.decode(prompt_ids) + solution)
        raise StopIteration  # what cold start would train on is all this test reads

    monkeypatch.setattr("gspo_cli.train.run.sft._encode", encode)
    with pytest.raises(StopIteration):
        cold_start(None, tokenizer, train.prompts, train.rows, recipe.cold_start, 0)  # type: ignore[arg-type]
    assert targets == [_chatml((USER, "What is 3 + 4?")) + "\\boxed{7}"]


def test_a_conversation_without_a_final_answer_is_prompt_only(
    tmp_path: Path, tokenizer: PreTrainedTokenizerBase
) -> None:
    rows = [{"messages": [_turn(USER, "What is 3 + 4?")], "answer": "7"}]
    recipe = _recipe(tmp_path, rows, prompt_column="messages")
    train = load_problems(recipe, tokenizer, "train")
    assert "solution" not in train.rows[0]
    with pytest.raises(GspoError, match=r"^cold_start: training row 0 has no 'solution'"):
        cold_start(None, tokenizer, train.prompts, train.rows, recipe.cold_start, 0)  # type: ignore[arg-type]


def test_the_system_prompt_goes_where_there_is_none(
    tmp_path: Path, tokenizer: PreTrainedTokenizerBase
) -> None:
    rows = [
        {"prompt": "What is 3 + 4?", "answer": "7"},
        {"prompt": [_turn(USER, "What is 5 + 1?")], "answer": "6"},
        {"prompt": [_turn(SYSTEM, "Own."), _turn(USER, "What is 2 + 2?")], "answer": "4"},
    ]
    recipe = _recipe(tmp_path, rows, system_prompt="Think first.", prompt_template="{prompt}")
    assert _texts(tokenizer, load_problems(recipe, tokenizer, "train")) == [
        _chatml((SYSTEM, "Think first."), (USER, "What is 3 + 4?")),
        _chatml((SYSTEM, "Think first."), (USER, "What is 5 + 1?")),
        _chatml((SYSTEM, "Own."), (USER, "What is 2 + 2?")),  # the row's own system turn wins
    ]


def test_chat_template_kwargs_reach_training_and_held_out_prompts(
    tmp_path: Path, tokenizer: PreTrainedTokenizerBase
) -> None:
    tokenizer.chat_template = THINKING_TEMPLATE
    rows = [{"prompt": [_turn(USER, f"What is {i} + 1?")], "answer": str(i + 1)} for i in range(3)]
    recipe = _recipe(tmp_path, rows, chat_template_kwargs={"enable_thinking": False})
    recipe.data.eval_source = recipe.data.source  # carved: held-out rows are conversations too
    recipe.data.heldout_size = 1
    problems = run_problems(recipe, tokenizer)
    assert all(t.endswith("assistant\n<think></think>") for t in _texts(tokenizer, problems.train))
    [held] = problems.heldout
    assert held.messages is not None and held.question.startswith("What is")
    # evaluation renders each held-out problem exactly as training renders its row
    heldout_ids = load_problems(recipe, tokenizer, "test").prompts[0]
    assert tokenizer.decode(heldout_ids).endswith("<think></think>")
    engine = FixedRolloutEngine(tokenizer, {tuple(heldout_ids): [f"\\boxed{{{held.answer}}}"]})
    params = SamplingParams(0.0, 1.0, 0, 8, 1)
    with MathVerifierPool(1, 5.0) as pool:
        values = heldout_accuracy(engine, tokenizer, [held], params, 0, pool, eval_format(recipe))
    assert values["accuracy"] == 1.0


def test_no_chat_template_is_an_error_unless_the_recipe_says_none(
    tmp_path: Path, tokenizer: PreTrainedTokenizerBase
) -> None:
    tokenizer.chat_template = None
    recipe = _recipe(tmp_path, [{"prompt": "What is 3 + 4?", "answer": "7"}])
    with pytest.raises(
        GspoError, match=r"has no chat template: set data\.chat_template: none"
    ) as exc:
        load_problems(recipe, tokenizer, "train")
    assert "\n" not in str(exc.value)
    recipe.data.chat_template = "none"
    [ids] = load_problems(recipe, tokenizer, "train").prompts
    raw = "What is 3 + 4?\nPut the final answer in \\boxed{}."
    assert ids == list(tokenizer(raw)["input_ids"]) and tokenizer.decode(ids) == raw


def test_raw_text_refuses_a_conversation(
    tmp_path: Path, tokenizer: PreTrainedTokenizerBase
) -> None:
    recipe = _recipe(
        tmp_path, [{"prompt": [_turn(USER, "Hi")], "answer": "7"}], chat_template="none"
    )
    with pytest.raises(GspoError, match=r"training row 0 \('Hi'\): a conversation needs a chat"):
        load_problems(recipe, tokenizer, "train")


def test_a_failing_chat_template_names_the_row(
    tmp_path: Path, tokenizer: PreTrainedTokenizerBase
) -> None:
    tokenizer.chat_template = (
        "{% for m in messages %}{% if m['role'] == 'tool' %}"
        "{{ raise_exception('tool turns are not supported') }}{% endif %}{{ m['content'] }}"
        "{% endfor %}"
    )
    rows = [
        {"prompt": [_turn(USER, "fine")], "answer": "1"},
        {"prompt": [_turn(USER, "call it"), _turn("tool", "42")], "answer": "2"},
    ]
    with pytest.raises(GspoError) as exc:
        load_problems(_recipe(tmp_path, rows), tokenizer, "train")
    assert str(exc.value) == (
        "data: training row 1 ('call it'): the chat template cannot render it "
        "(TemplateError: tool turns are not supported)"
    )


BAD_CONVERSATIONS = [
    ([_turn("bot", "hi")], "turn 0 has role 'bot'; known: system, user, assistant, tool"),
    ([_turn(USER, "hi"), {"content": "hi"}], "turn 1 has no role"),
    ([{"role": USER}], "turn 0 (user) has no content"),
    (["hi"], "turn 0 is 'hi' (str), not a {role, content} message"),
    ([_turn(ASSISTANT, "only")], "the conversation has no turn before the assistant's answer"),
    (17, "prompt is 17 (int): neither text nor a list of messages"),
]


@pytest.mark.parametrize(("prompt", "problem"), BAD_CONVERSATIONS)
def test_a_bad_conversation_is_one_line_naming_the_row(
    tmp_path: Path, prompt: Any, problem: str
) -> None:
    recipe = _recipe(tmp_path, [{"prompt": prompt, "answer": "2"}])
    with pytest.raises(GspoError) as exc:
        training_rows(recipe)
    assert str(exc.value) == f"data: {recipe.data.source} row 0: {problem}"


def test_null_answers_are_dropped_and_counted_numbers_become_text(
    tmp_path: Path, tokenizer: PreTrainedTokenizerBase
) -> None:
    rows: list[dict[str, Any]] = [
        {"prompt": "a", "answer": 42},
        {"prompt": "b", "answer": None},
        {"prompt": "c", "answer": 2.5},
        {"prompt": "d", "answer": None},
        {"prompt": "e", "answer": 3.0},
    ]
    recipe = _recipe(tmp_path, rows, prompt_template="{prompt}")
    problems = run_problems(recipe, tokenizer)
    assert [(r["prompt"], r["answer"]) for r in problems.train.rows] == [
        ("a", "42"), ("c", "2.5"), ("e", "3"),
    ]  # fmt: skip
    source = recipe.data.source
    assert problems.notes == [
        f"data: 2 rows of {source} have a null answer (and no tests): dropped"
    ]


def test_over_long_prompts_are_counted_too(
    tmp_path: Path, tokenizer: PreTrainedTokenizerBase
) -> None:
    rows = [{"prompt": "x" * n, "answer": "1"} for n in (1, 300, 2)]
    problems = run_problems(_recipe(tmp_path, rows), tokenizer)
    assert len(problems.train.rows) == 2
    assert problems.notes == [
        "data: 1 of 3 training prompts are longer than data.max_prompt_tokens=256: dropped"
    ]


def test_a_structured_answer_is_refused_unless_the_reward_takes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = [{"prompt": "a", "answer": None}, {"prompt": "b", "answer": [1, 2]}]
    with pytest.raises(GspoError) as exc:
        training_rows(_recipe(tmp_path, rows))
    assert f"{tmp_path / 'train.jsonl'} row 1: answer [1, 2] (list) is not text, and reward " in (
        str(exc.value)
    )
    (tmp_path / "set_rewards.py").write_text(
        "from gspo_cli.rewards.contract import takes_structured_answers\n\n"
        "@takes_structured_answers\n"
        "def overlap(completions, answer):\n"
        "    return [float(str(a) in c) for c, a in zip(completions, answer)]\n\n"
        "def plain(completions, answer):\n"
        "    return [0.0 for _ in completions]\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    taken = training_rows(_recipe(tmp_path, rows, rewards=("set_rewards:overlap",)))
    assert [r["answer"] for r in taken] == [[1, 2]]
    both = _recipe(tmp_path, rows, rewards=("set_rewards:overlap", "set_rewards:plain"))
    with pytest.raises(GspoError, match="reward set_rewards:plain reads answers as text"):
        training_rows(both)


def test_template_kwargs_reach_gspo_eval_prompts(tokenizer: PreTrainedTokenizerBase) -> None:
    tokenizer.chat_template = THINKING_TEMPLATE
    settings = EvalSettings(
        "builtin:tiny-dense", "gsm8k", chat_template_kwargs={"enable_thinking": False}
    )
    text = tokenizer.decode(render_prompt(tokenizer, "What is 3 + 4?", settings.prompt_format))
    assert text == _chatml((USER, "What is 3 + 4?")) + "<think></think>"


def test_recipe_checks_of_the_chat_fields() -> None:
    with pytest.raises(ValueError, match="system_prompt needs a chat template"):
        Recipe.model_validate({"data": {"chat_template": "none", "system_prompt": "Hi"}})
    with pytest.raises(ValueError, match="chat_template_kwargs need a chat template"):
        Recipe.model_validate({"data": {"chat_template": "none", "chat_template_kwargs": {"a": 1}}})
    with pytest.raises(ValueError, match="'tokenize' is a parameter of apply_chat_template"):
        Recipe.model_validate({"data": {"chat_template_kwargs": {"tokenize": True}}})
    with pytest.raises(ValueError, match="chat_template"):
        Recipe.model_validate({"data": {"chat_template": "chatml"}})


# A custom benchmark in both TRL conversational formats: a `prompt` of messages, and `messages`
# ending with the assistant's worked answer.
ASKED = [_turn(SYSTEM, "Answer tersely."), _turn(USER, "What is 3 + 4?")]
WORKED = [_turn(USER, "What is 2 + 2?"), _turn(ASSISTANT, "2+2=4 \\boxed{4}")]


@pytest.mark.parametrize("template", [None, "Q: {prompt}"])
def test_gspo_eval_asks_conversational_custom_rows_as_training_does(
    tmp_path: Path, template: str | None
) -> None:
    rows = [{"prompt": ASKED, "answer": 7}, {"messages": WORKED, "answer": "4"}]
    data = _write(tmp_path / "chats.jsonl", rows)
    first, second = load_benchmark("custom", data)
    assert (first.question, first.messages) == ("What is 3 + 4?", tuple(ASKED))
    assert second.messages == tuple(WORKED[:1])  # the worked answer is never part of the prompt
    assert second.metadata["solution"] == WORKED[1]["content"]
    own = template or "{prompt}"  # a template of one's own goes into the last user turn
    expected = {
        _chatml((SYSTEM, "Answer tersely."), (USER, own.format(prompt="What is 3 + 4?"))): "7",
        _chatml((USER, own.format(prompt="What is 2 + 2?"))): "4",
    }
    if template is not None:  # training renders the same row the same way
        recipe = _recipe(tmp_path, [{"prompt": ASKED, "answer": "7"}], prompt_template=template)
        tokenizer = build_char_tokenizer()
        assert _texts(tokenizer, load_problems(recipe, tokenizer, "train")) == list(expected)[:1]

    def answering(model: Any, tokenizer: PreTrainedTokenizerBase) -> FixedRolloutEngine:
        answers = {
            tuple(tokenizer(text, add_special_tokens=False)["input_ids"]): [f"\\boxed{{{gold}}}"]
            for text, gold in expected.items()
        }
        return FixedRolloutEngine(tokenizer, answers)

    settings = EvalSettings(
        "builtin:tiny-dense", "custom", samples=1, data=data, prompt_template=template
    )
    console = Console(file=io.StringIO(), width=200)
    results = run_eval(settings, tmp_path / "ev", console=console, engine_factory=answering)
    assert results["metrics"]["avg@1"]["value"] == 1.0  # both asked as expected, and right


def test_a_text_question_wins_over_a_messages_column(tmp_path: Path) -> None:
    """NuminaMath-CoT-like rows ship `problem` and the worked `messages`: asked the text."""
    row = {"problem": "What is 2 + 2?", "messages": WORKED, "answer": "4"}
    (problem,) = load_benchmark("custom", _write(tmp_path / "both.jsonl", [row]))
    assert (problem.question, problem.messages) == ("What is 2 + 2?", None)


def test_a_conversation_without_a_user_turn_is_asked_without_a_template(
    tmp_path: Path, tokenizer: PreTrainedTokenizerBase
) -> None:
    """gspo eval without a template of its own leaves every conversation as it is."""
    turns = [_turn(SYSTEM, "Continue: 1, 2, 3")]
    rows = [{"prompt": turns, "answer": "4"}]
    (problem,) = load_benchmark("custom", _write(tmp_path / "c.jsonl", rows))
    settings = EvalSettings("builtin:tiny-dense", "custom", samples=1)
    ids = render_prompt(tokenizer, list(problem.messages or ()), settings.prompt_format)
    text = tokenizer.decode(ids)
    assert text == _chatml((SYSTEM, "Continue: 1, 2, 3"))


def test_a_custom_benchmark_trains_on_its_conversations_as_they_are(
    tmp_path: Path, tokenizer: PreTrainedTokenizerBase
) -> None:
    rows = [{"prompt": ASKED, "answer": 7}, {"messages": WORKED, "answer": "4"}]
    data = _write(tmp_path / "chats.jsonl", rows)
    recipe = _recipe(tmp_path, [])
    recipe.data.source = f"benchmark:custom:{data}"
    train = load_problems(recipe, tokenizer, "train")
    assert [row["prompt"] for row in train.rows] == [ASKED, WORKED[:1]]
    assert _texts(tokenizer, train)[1] == _chatml((USER, "What is 2 + 2?"))


@pytest.mark.parametrize(("prompt", "problem"), BAD_CONVERSATIONS)
@pytest.mark.parametrize("column", ["prompt", "messages"])
def test_a_bad_conversational_custom_row_is_one_line_as_in_training(
    tmp_path: Path, prompt: Any, problem: str, column: str
) -> None:
    data = _write(tmp_path / "bad.jsonl", [{column: prompt, "answer": "2"}])
    with pytest.raises(GspoError) as exc:
        load_benchmark("custom", data)
    assert str(exc.value) == f"{data}: row 0: custom: {problem}"
