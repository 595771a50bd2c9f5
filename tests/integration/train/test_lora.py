"""LoRA through peft (`model.lora`): only the adapters train, the KL reference is the base with
them off, checkpoints resume exactly, `gspo eval` and `gspo export` see base + adapters, and a
target module the model lacks is one line before anything is written."""

from __future__ import annotations

import copy
import io
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from pydantic import ValidationError
from rich.console import Console
from safetensors.torch import load_file

from gspo_cli.models import create_builtin, load_policy
from gspo_cli.models.forward.batch import TrainBatch
from gspo_cli.recipe import Recipe
from gspo_cli.rollout.base import SamplingParams
from gspo_cli.rollout.hf import HFGenerateEngine
from gspo_cli.train.engines.distributed import LOCAL
from gspo_cli.train.engines.settings import engine_settings
from gspo_cli.train.engines.torch_engine import FrozenPolicy, TorchEngine
from gspo_cli.train.run.reference import BaseReference
from gspo_cli.train.step.train_batch import build_train_batch
from gspo_cli.train.step.update import StepModels, rl_step
from tests.support.helpers import invoke_cli, write_recipe
from tests.support.rl_helpers import GROUP, PROMPTS, LengthParityReward, tiny_step

LORA = {"r": 4, "alpha": 8}


def _lora_recipe(replay: str = "off", **lora: Any) -> Recipe:
    return Recipe.model_validate(
        {
            "model": {"lora": {**LORA, **lora}},
            "algorithm": {"minibatches": 2, "kl_coef": 0.1, "routing_replay": replay},
            "optimizer": {"lr": 1e-2},
        }
    )


def _lora_engine(
    name: str = "tiny-dense", replay: str = "off", **lora: Any
) -> tuple[TorchEngine, Any, Recipe]:
    model, tokenizer = create_builtin(name, seed=0)
    recipe = _lora_recipe(replay, **lora)
    return TorchEngine(model, engine_settings(recipe), LOCAL), tokenizer, recipe


def _step(engine: TorchEngine, tokenizer: Any, recipe: Recipe, seed: int, ref: Any) -> Any:
    params = SamplingParams(temperature=1.0, max_new_tokens=12, num_samples=GROUP)
    settings = tiny_step(recipe, sampling=params, tokenizer=tokenizer)
    rows = [{"prompt": "p", "answer": "0"}] * len(PROMPTS)
    rollout = HFGenerateEngine(engine.model, tokenizer)
    return rl_step(
        StepModels(engine, ref), rollout, LengthParityReward(), PROMPTS, rows, settings, seed
    )


def _batch(engine: TorchEngine, tokenizer: Any) -> TrainBatch:
    """Responses the policy samples for PROMPTS, as a training batch."""
    params = SamplingParams(temperature=1.0, max_new_tokens=8, num_samples=2)
    rollout = HFGenerateEngine(engine.model, tokenizer).generate(PROMPTS, params)
    return build_train_batch(rollout, int(tokenizer.pad_token_id))


@pytest.mark.parametrize(
    "name,replay",
    # all-linear on MoE: peft adapts the routers' and the experts' parameters too, in
    # wrappers that routing replay must see through (it raises when it cannot force)
    [("tiny-dense", "off"), ("tiny-moe", "old_policy")],
)
def test_a_step_trains_only_the_adapters_against_the_base_as_kl_reference(
    name: str, replay: str
) -> None:
    torch.manual_seed(0)
    engine, tokenizer, recipe = _lora_engine(name, replay)
    frozen_base = copy.deepcopy(create_builtin(name, seed=0)[0]).eval()
    assert engine.adapters is not None
    before = {n: p.detach().clone() for n, p in engine.model.named_parameters()}
    trainable = {n for n, p in engine.model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_" in n for n in trainable)
    optimised = {id(p) for group in engine.optimizer.param_groups for p in group["params"]}
    assert optimised == {id(p) for n, p in engine.model.named_parameters() if n in trainable}

    reference = BaseReference(engine, engine.adapters)
    for step in range(2):
        out = _step(engine, tokenizer, recipe, step, reference)
        assert out.metrics["grad_norm"] > 0
    changed = {n for n, p in engine.model.named_parameters() if not torch.equal(p, before[n])}
    assert changed and changed <= trainable  # base weights bit-identical
    assert any("lora_B" in n for n in changed)  # B starts at 0: the adapters now matter

    batch = _batch(engine, tokenizer)
    with torch.no_grad():
        ref_lp, _ = reference.logprobs(batch, 1.0)
        base_lp, _ = FrozenPolicy(frozen_base, share_prompts=True).logprobs(batch, 1.0)
        policy_lp, _ = engine.logprobs(batch, 1.0)
    assert torch.equal(ref_lp, base_lp)  # the base itself: adapters off, no copy
    assert not torch.allclose(policy_lp, base_lp)  # the policy is the adapted model


@pytest.mark.parametrize(
    "name,targets", [("tiny-dense", ["q_proj", "down_proj"]), ("tiny-moe", "all-linear")]
)
def test_merged_weights_equal_merge_and_unload_and_leave_the_model_alone(
    tmp_path: Path, name: str, targets: Any
) -> None:
    """What the vLLM engine syncs and saves: plain HF names, adapters merged in (on MoE, the
    routers' and experts' parameters too)."""
    engine, _, _ = _lora_engine(name, target_modules=targets)
    assert engine.adapters is not None
    with torch.no_grad():
        for key, p in engine.model.named_parameters():
            if "lora_B" in key:
                p.normal_(0, 0.1)
    state = {k: v.clone() for k, v in engine.model.state_dict().items()}
    merged = dict(engine.full_weights())
    assert all(torch.equal(v, engine.model.state_dict()[k]) for k, v in state.items())
    reference = copy.deepcopy(engine.adapters.peft).merge_and_unload().state_dict()
    assert merged.keys() == reference.keys()
    for key, tensor in reference.items():
        torch.testing.assert_close(merged[key], tensor, rtol=0, atol=1e-6)
    # as vllm.py writes it: the trainer model's save_pretrained with the merged state dict
    engine.model.save_pretrained(tmp_path / "synced", state_dict=merged)
    from transformers import AutoModelForCausalLM

    synced = AutoModelForCausalLM.from_pretrained(tmp_path / "synced")
    ids = torch.tensor([PROMPTS[0]])
    with torch.no_grad():
        torch.testing.assert_close(
            synced(ids).logits, engine.model(ids).logits, rtol=1e-5, atol=1e-5
        )


def test_recipe_checks() -> None:
    bad = [
        ({"model": {"lora": {"r": -1}}}, "model.lora.r"),
        ({"model": {"lora": {"alpha": 8}}}, "alpha has no effect with r 0"),
        ({"model": {"lora": {"r": 4, "target_modules": "q_proj"}}}, "list of module names"),
        ({"model": {"lora": {"r": 4, "target_modules": []}}}, "target_modules"),
        (
            {"model": {"lora": {"r": 4}}, "algorithm": {"kl_coef": 0.1, "ref_update_every": 2}},
            "adapters switched off",
        ),
    ]
    for raw, message in bad:
        with pytest.raises(ValidationError, match=message):
            Recipe.model_validate(raw)
    ok = Recipe.model_validate({"model": {"lora": {"r": 8, "target_modules": ["q_proj"]}}})
    assert ok.model.lora.target_modules == ["q_proj"]
    assert Recipe().model.lora.r == 0  # off by default


def test_a_target_the_model_lacks_is_one_line_and_writes_nothing(tmp_path: Path) -> None:
    recipe = write_recipe(
        tmp_path, {"model": {"lora": {"r": 4, "target_modules": ["q_proj", "qkv_proj"]}}}
    )
    out = tmp_path / "run"
    for command in (("validate", str(recipe)), ("train", str(recipe), "--out", str(out))):
        result = invoke_cli(*command)
        assert result.returncode == 2, result.stderr
        assert result.stderr.count("\n") == 1, result.stderr
        assert "has no module 'qkv_proj'" in result.stderr
        assert "q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj" in result.stderr
    assert not out.exists()


def _metrics(run: Path) -> dict[int, dict[str, Any]]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return {rec["step"]: rec for rec in map(json.loads, lines)}


def _adapters(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(str(folder / "adapter_model.safetensors"))


@pytest.mark.slow
def test_a_lora_run_logs_its_share_and_resumes_exactly(
    tiny_recipe, sft_checkpoint: Path, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    recipe = tiny_recipe(
        model={"lora": {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj", "up_proj"]}},
        algorithm={"kl_coef": 0.05},
        optimizer={"lr": 3e-3},
        trainer={"steps": 4, "checkpoint_every": 2, "keep_checkpoints": 2},
    )
    straight = tmp_path / "straight"
    result = invoke_cli("train", str(recipe), "--out", str(straight))
    assert result.returncode == 0, result.stderr[-2000:]
    share = [line for line in result.stdout.splitlines() if line.startswith("lora: ")]
    assert len(share) == 1 and "parameters train (" in share[0], result.stdout
    trainable, total = (int(x.replace(",", "")) for x in share[0].split(": ")[2].split()[:3:2])
    assert 0 < trainable < total / 10
    checkpoint = straight / "checkpoints" / "step_000004"
    assert (checkpoint / "adapter_config.json").is_file() and (
        checkpoint / "optimizer.pt"
    ).is_file()
    assert not (checkpoint / "model.safetensors").exists()  # the adapters, not a model copy
    config = json.loads((checkpoint / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(sft_checkpoint.resolve())
    a = _metrics(straight)
    assert any(a[s]["reward_std"] > 0 for s in a), "no signal: the test would be vacuous"
    assert all(a[s]["kl"] >= 0 for s in a) and a[4]["kl"] > 0  # the adapters moved off the base

    # Stop after step 2 (the run as it stood then: its step-2 checkpoint), then resume.
    stopped = tmp_path / "stopped"
    shutil.copytree(straight, stopped)
    shutil.rmtree(stopped / "checkpoints" / "step_000004")
    (stopped / "checkpoints" / "latest").write_text("step_000002")
    resumed = invoke_cli("train", str(recipe), "--out", str(stopped), "--resume")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resume: loaded checkpoint" in resumed.stdout
    b = _metrics(stopped)
    assert sorted(b) == [1, 2, 3, 4]
    for step in (3, 4):
        for key in ("loss", "reward_mean", "grad_norm", "kl", "clip_frac", "response_len_mean"):
            if key in a[step] or key in b[step]:
                assert b[step][key] == a[step][key], (step, key)
    final_a, final_b = _adapters(checkpoint), _adapters(stopped / "checkpoints" / "step_000004")
    assert final_a.keys() == final_b.keys()
    assert all(torch.equal(final_a[k], final_b[k]) for k in final_a)


PARITY = """
def parity(completions, **kwargs):
    return [float(len(c) % 2) for c in completions]
"""


@pytest.fixture(scope="module")
def builtin_lora_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-step LoRA run on the seeded built-in model, no cold start (its base is saved), with
    a reward that has signal even for a random model."""
    folder = tmp_path_factory.mktemp("lora")
    (folder / "lora_rewards.py").write_text(PARITY)
    recipe = write_recipe(
        folder,
        {
            "model": {"lora": {"r": 4, "alpha": 16, "target_modules": ["q_proj", "o_proj"]}},
            "reward": {"functions": [{"name": "lora_rewards:parity"}]},
            "optimizer": {"lr": 5e-2},
            "trainer": {"steps": 2, "checkpoint_every": 1, "seed": 3},
            "algorithm": {"minibatches": 1},
        },
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(folder)  # the reward module is importable from here
        result = invoke_cli("train", str(recipe), "--out", str(folder / "run"))
    assert result.returncode == 0, result.stderr[-2000:]
    return folder / "run"


def _adapted_logits(run: Path, ids: torch.Tensor) -> torch.Tensor:
    """The trained policy computed the way the trainer does: the seeded base model with the
    checkpoint's adapters loaded by peft, not merged."""
    from peft import PeftModel

    base, _ = create_builtin("tiny-dense", seed=3)  # the run's trainer.seed
    adapted = PeftModel.from_pretrained(base, str(run / "checkpoints" / "step_000002")).eval()
    with torch.no_grad():
        logits: torch.Tensor = adapted(input_ids=ids).logits
    return logits


def test_eval_of_a_lora_run_is_base_plus_adapters(builtin_lora_run: Path, tmp_path: Path) -> None:
    run = builtin_lora_run
    assert (run / "lora_base" / "config.json").is_file()
    ids = torch.tensor([PROMPTS[1]])
    expected = _adapted_logits(run, ids)
    base, _ = create_builtin("tiny-dense", seed=3)
    with torch.no_grad():
        assert not torch.allclose(base(input_ids=ids).logits, expected)  # the adapters count
    model, _ = load_policy(str(run / "checkpoints" / "step_000002"))
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids).logits, expected, rtol=1e-5, atol=1e-5)
    # A run folder moved elsewhere: its checkpoint's base is found in it.
    moved = tmp_path / "moved"
    shutil.copytree(run, moved)
    config_file = moved / "checkpoints" / "step_000002" / "adapter_config.json"
    config = json.loads(config_file.read_text())
    config["base_model_name_or_path"] = str(tmp_path / "gone" / "lora_base")
    config_file.write_text(json.dumps(config))
    model, _ = load_policy(str(config_file.parent))
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids).logits, expected, rtol=1e-5, atol=1e-5)

    from gspo_cli.eval.runner import EvalSettings, run_eval

    data = tmp_path / "q.jsonl"
    data.write_text(
        "\n".join(
            json.dumps({"question": f"Compute {i}+1.", "answer": str(i + 1)}) for i in range(2)
        )
    )
    settings = EvalSettings(
        str(run), "custom", samples=2, max_new_tokens=8, data=str(data), verifier_workers=1
    )
    results = run_eval(settings, tmp_path / "ev", console=Console(file=io.StringIO()))
    assert results["checkpoint"] == str(run / "checkpoints" / "step_000002")
    assert results["problems"] == 2


def test_export_writes_a_plain_merged_checkpoint(
    builtin_lora_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "exported"
    result = invoke_cli("export", str(builtin_lora_run), str(out))
    assert result.returncode == 0, result.stderr[-2000:]
    assert sorted(p.name for p in out.iterdir() if p.suffix in (".json", ".safetensors")) == [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    assert not list(tmp_path.glob(".*.tmp"))  # no staging folder left
    ids = torch.tensor([PROMPTS[2]])
    expected = _adapted_logits(builtin_lora_run, ids)
    monkeypatch.setitem(sys.modules, "peft", None)  # transformers alone loads it
    from transformers import AutoModelForCausalLM, AutoTokenizer

    plain = AutoModelForCausalLM.from_pretrained(out)
    AutoTokenizer.from_pretrained(out)
    with torch.no_grad():
        torch.testing.assert_close(plain(input_ids=ids).logits, expected, rtol=1e-5, atol=1e-5)

    again = invoke_cli("export", str(builtin_lora_run), str(out))
    assert again.returncode == 2 and again.stderr.count("\n") == 1, again.stderr
    assert "exists and is not empty" in again.stderr


def test_eval_and_export_merge_a_bf16_run_alike(builtin_lora_run: Path, tmp_path: Path) -> None:
    """gspo eval of a LoRA run scores the very weights gspo export writes: both load the base
    in the run's dtype (here its recipe says bfloat16) and merge the adapters in float32."""
    from transformers import AutoModelForCausalLM

    from gspo_cli.eval.checkpoints import load_for_eval

    run = tmp_path / "run"
    shutil.copytree(builtin_lora_run, run)
    recipe = yaml.safe_load((run / "recipe.yaml").read_text())
    recipe["model"]["dtype"] = "bfloat16"
    (run / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    result = invoke_cli("export", str(run), str(tmp_path / "exported"))
    assert result.returncode == 0, result.stderr[-2000:]
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "exported", dtype=torch.float32)
    scored, _ = load_for_eval(str(run / "checkpoints" / "step_000002"))
    theirs, ours = exported.state_dict(), scored.state_dict()
    assert all(t.dtype == torch.float32 for t in ours.values())
    assert theirs.keys() == ours.keys()
    assert all(torch.equal(theirs[key], ours[key]) for key in theirs)
    saved = load_file(str(tmp_path / "exported" / "model.safetensors"))
    assert all(t.dtype == torch.float32 for t in saved.values())
    # merged in float32: the adapters' updates are not rounded to bfloat16 with the base
    assert any(not torch.equal(t, t.bfloat16().float()) for t in ours.values())
    in_float32, _ = load_for_eval(str(builtin_lora_run / "checkpoints" / "step_000002"))
    merged = in_float32.state_dict()
    assert any(not torch.equal(merged[key], ours[key]) for key in ours)  # the dtype mattered


def test_export_of_a_full_fine_tune_copies_its_hf_files(
    sft_checkpoint: Path, tmp_path: Path
) -> None:
    checkpoint = tmp_path / "checkpoints" / "step_000003"  # as a full fine-tune saves it
    shutil.copytree(sft_checkpoint, checkpoint)
    for name in ("optimizer.pt", "trainer_state.pt"):
        (checkpoint / name).write_bytes(b"trainer state")
    out = tmp_path / "empty"
    out.mkdir()  # an empty folder is fine
    result = invoke_cli("export", str(checkpoint), str(out))
    assert result.returncode == 0, result.stderr[-2000:]
    assert not list(out.glob("*.pt"))
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in sft_checkpoint.iterdir())
    for name in ("config.json", "model.safetensors"):
        assert (out / name).read_bytes() == (sft_checkpoint / name).read_bytes()
