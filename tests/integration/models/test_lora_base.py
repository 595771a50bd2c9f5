"""What a LoRA run's adapters are merged into is what they were trained on: an LM head tied to
the input embeddings is refused as a target (and older adapters on one merge untied, exactly),
and a local base folder whose weights change is refused by eval, export and --resume."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from gspo_cli.models import create_builtin
from gspo_cli.recipe import load_recipe
from gspo_cli.runs.folder import GGUF_BASE
from tests.support.helpers import invoke_cli, run_cli, write_recipe

HEAD = {"r": 2, "alpha": 4, "target_modules": ["q_proj", "lm_head"]}
IDS = torch.tensor([[5, 9, 17, 3, 40, 41, 7]])


def _one_line(result: object, *fragments: str) -> None:
    assert result.returncode == 2, result.stdout  # type: ignore[attr-defined]
    err = result.stderr.strip()  # type: ignore[attr-defined]
    assert "Traceback" not in err and err.count("\n") == 0, err
    assert all(fragment in err for fragment in fragments), err


@pytest.mark.parametrize("command", ["validate", "train"])
def test_a_lora_on_a_tied_lm_head_is_refused_before_anything_is_written(
    tmp_path: Path, command: str
) -> None:
    recipe = write_recipe(tmp_path, {"model": {"lora": HEAD}, "trainer": {"steps": 1}})
    out = tmp_path / "run"
    result = invoke_cli(command, str(recipe), *(["--out", str(out)] if command == "train" else []))
    _one_line(result, "lm_head", "tied embeddings", "embed_tokens", "remove lm_head")
    assert not out.exists()


def _legacy_head_adapters(tmp_path: Path) -> tuple[Path, torch.Tensor]:
    """Adapters on q_proj and the tied lm_head, as runs saved them before the refusal, on a
    saved built-in base; and the logits the trained model (base + adapters, unmerged) gives."""
    import peft

    base_dir, adapters = tmp_path / "base", tmp_path / "adapters"
    model, tokenizer = create_builtin("tiny-dense", seed=1)
    model.save_pretrained(base_dir)
    tokenizer.save_pretrained(base_dir)
    config = peft.LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "lm_head"])
    wrapped = peft.get_peft_model(model, config)
    torch.manual_seed(0)
    with torch.no_grad():
        for name, param in wrapped.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.5)  # a trained update (B is 0 when fresh)
        logits = wrapped.eval()(input_ids=IDS).logits
    wrapped.peft_config["default"].base_model_name_or_path = str(base_dir)
    wrapped.save_pretrained(adapters)
    return adapters, logits


def test_older_adapters_on_a_tied_head_export_the_trained_model_quietly(tmp_path: Path) -> None:
    adapters, trained = _legacy_head_adapters(tmp_path)
    out = tmp_path / "exported"
    result = run_cli("export", str(adapters), str(out))  # a subprocess: pytest keeps warnings
    assert result.returncode == 0, result.stderr[-2000:]
    assert "tie_word_embeddings" not in result.stderr and "peft" not in result.stderr
    exported = AutoModelForCausalLM.from_pretrained(out).eval()
    with torch.no_grad():
        logits = exported(input_ids=IDS).logits
    assert (logits - trained).abs().max().item() < 1e-5


def _local_base_run(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A 1-step LoRA run on a local folder holding a saved built-in model."""
    base = tmp_path / "base"
    model, tokenizer = create_builtin("tiny-dense", seed=2)
    model.save_pretrained(base)
    tokenizer.save_pretrained(base)
    lora = {"r": 2, "alpha": 4, "target_modules": ["q_proj"]}
    recipe = write_recipe(
        tmp_path, {"model": {"path": str(base), "lora": lora}, "trainer": {"steps": 1}}
    )
    run = tmp_path / "run"
    trained = invoke_cli("train", str(recipe), "--out", str(run))
    assert trained.returncode == 0, trained.stderr[-2000:]
    return base, recipe, run


def test_a_changed_local_base_folder_is_refused_by_eval_export_and_resume(tmp_path: Path) -> None:
    base, recipe, run = _local_base_run(tmp_path)
    record = json.loads((run / "checkpoints" / "step_000001" / GGUF_BASE).read_text())
    assert record["base_model_name_or_path"] == str(base.resolve())
    was = record["sha256"]

    other, _ = create_builtin("tiny-dense", seed=5)
    other.save_pretrained(base)  # new weights under the same name
    fragments = (str(base.resolve()), f"was {was[:12]}", "has changed")
    bench = tmp_path / "bench.jsonl"
    bench.write_text('{"id": "p0", "question": "1+1=", "answer": "2"}\n')
    args = ["--benchmark", "custom", "--data", str(bench), "--max-new-tokens", "4"]
    evaluated = invoke_cli("eval", str(run), *args, "--out", str(tmp_path / "e"))
    _one_line(evaluated, *fragments)
    exported = tmp_path / "exported"
    _one_line(invoke_cli("export", str(run), str(exported)), *fragments)
    assert not exported.exists()
    resumed = invoke_cli("train", str(recipe), "--out", str(run), "--resume")
    _one_line(resumed, *fragments)


def test_the_loaded_model_is_checked_for_a_tied_target_too() -> None:
    """A model whose modules are unknown at validate time (a hub id not cached yet)."""
    from gspo_cli.core.errors import GspoError
    from gspo_cli.models.lora import Adapters

    model, _ = create_builtin("tiny-dense", seed=0)
    with pytest.raises(GspoError, match="lm_head of the model shares its weight with"):
        Adapters.add(model, r=2, alpha=4, dropout=0.0, targets=["lm_head"])


@pytest.mark.slow
def test_a_hub_id_base_is_digested_and_one_gone_from_the_cache_refused_on_resume(
    tmp_path: Path,
) -> None:
    """A LoRA base named by hub id is pinned by its cached snapshot's files, as a local folder
    is (run in subprocesses: the hub cache's place is read when huggingface_hub is imported)."""
    cache = tmp_path / "hub"
    snapshot = cache / "models--cached--tiny" / "snapshots" / ("0" * 40)
    model, tokenizer = create_builtin("tiny-dense", seed=2)
    model.save_pretrained(snapshot)
    tokenizer.save_pretrained(snapshot)
    (cache / "models--cached--tiny" / "refs").mkdir()
    (cache / "models--cached--tiny" / "refs" / "main").write_text("0" * 40)
    lora = {"r": 2, "alpha": 4, "target_modules": ["q_proj"]}
    recipe = write_recipe(
        tmp_path, {"model": {"path": "cached/tiny", "lora": lora}, "trainer": {"steps": 1}}
    )
    env = {"HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    run = tmp_path / "run"
    trained = run_cli("train", str(recipe), "--out", str(run), env=env)
    assert trained.returncode == 0, trained.stderr[-2000:]
    record = json.loads((run / "checkpoints" / "step_000001" / GGUF_BASE).read_text())
    # pinned, where a hub id was not before; a changed snapshot is then refused by the check
    # a local folder's change meets (test_a_changed_local_base_folder_is_refused_by_...)
    assert len(record["sha256"]) == 64
    (cache / "models--cached--tiny" / "refs" / "main").unlink()  # gone from the cache
    missing = run_cli("train", str(recipe), "--out", str(run), "--resume", env=env)
    _one_line(missing, "'cached/tiny' is not in the local hub cache", "cannot be checked")


def test_a_lora_run_folder_as_teacher_is_its_latest_checkpoint(tmp_path: Path) -> None:
    _, _, run = _local_base_run(tmp_path)
    student = {"model": {"path": "builtin:tiny-dense"}, "trainer": {"steps": 1}}
    distill = {"name": "gspo_token", "distill": {"teacher": str(run)}}
    (tmp_path / "student").mkdir()
    recipe = write_recipe(tmp_path / "student", {**student, "algorithm": distill})
    validated = invoke_cli("validate", str(recipe))
    assert validated.returncode == 0, validated.stderr
    teacher = load_recipe(recipe).algorithm.distill
    assert teacher is not None and teacher.teacher == str(run / "checkpoints" / "step_000001")
    (run / "checkpoints" / "latest").unlink()
    for folder in (run / "checkpoints").iterdir():  # a run stopped before its first save
        folder.rename(tmp_path / folder.name)
    _one_line(invoke_cli("validate", str(recipe)), "is a run folder with no checkpoint yet")
