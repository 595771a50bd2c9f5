"""DeepSpeed's start on CPU says what matters and nothing else: no "Setting accelerator to CPU"
warning (nor any DeepSpeed import in torch-engine runs), and no build of the shared-memory
communication op it never uses."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.helpers import REPO

pytest.importorskip("deepspeed")
pytestmark = pytest.mark.slow


def _python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Run `code` with DS_ACCELERATOR unset (an in-process DeepSpeed test may have set it here),
    so that DeepSpeed would probe, and warn, unless told."""
    inherited = {k: v for k, v in os.environ.items() if k != "DS_ACCELERATOR"}
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**inherited, **env},
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def test_torch_engine_code_never_imports_deepspeed() -> None:
    code = (
        "import sys\n"
        "import gspo_cli.cli, gspo_cli.train.run.loop, gspo_cli.train.engines.launch\n"
        "import gspo_cli.eval.runner\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'deepspeed'))\n"
    )
    assert _python(code).stdout.strip() == "[]"


def test_deepspeed_on_cpu_is_told_its_accelerator_and_does_not_warn() -> None:
    code = (
        "import torch\n"
        "from gspo_cli.train.engines.distributed import import_deepspeed\n"
        "import_deepspeed(torch.device('cpu'))\n"
        "from deepspeed.accelerator import get_accelerator\n"
        "print(get_accelerator().device_name())\n"
    )
    result = _python(code)
    assert result.stdout.strip().splitlines()[-1] == "cpu"
    assert "Setting accelerator" not in result.stdout + result.stderr


def test_the_process_group_starts_without_building_the_shm_op(tmp_path: Path) -> None:
    """DeepSpeed's shared-memory op (inference only) would be JIT-built into torch's extensions
    folder at the first init_distributed in each venv (86 s on 2 cores): it is not built."""
    code = (
        "import torch, torch.distributed as dist\n"
        "from gspo_cli.train.engines.distributed import LOCAL, init_process_group\n"
        "init_process_group(LOCAL, torch.device('cpu'))\n"
        "total = torch.ones(3)\n"
        "dist.all_reduce(total)\n"
        "print(total.tolist())\n"
    )
    result = _python(code, TORCH_EXTENSIONS_DIR=str(tmp_path))
    assert result.stdout.strip().splitlines()[-1] == "[1.0, 1.0, 1.0]"
    assert "shm_comm" not in result.stdout + result.stderr
    assert not any(tmp_path.iterdir()), sorted(tmp_path.iterdir())


ADAPTERS = """
import json, sys
from pathlib import Path
from peft import LoraConfig, get_peft_model
from gspo_cli.models import load_policy
root = Path(sys.argv[1])
model, tokenizer = load_policy("builtin:tiny-dense")
model.save_pretrained(root / "base")
peft = get_peft_model(model, LoraConfig(r=2, target_modules=["q_proj"]))
peft.save_pretrained(root / "adapters")
tokenizer.save_pretrained(root / "adapters")
config = root / "adapters" / "adapter_config.json"
fields = {**json.loads(config.read_text()), "base_model_name_or_path": str(root / "base")}
config.write_text(json.dumps(fields))
"""


def test_export_of_a_lora_checkpoint_on_cpu_does_not_warn(tmp_path: Path) -> None:
    """The merge saves with save_pretrained, which imports DeepSpeed: it used to probe for a
    GPU and print "Setting accelerator to CPU" on every `gspo export`."""
    inherited = {k: v for k, v in os.environ.items() if k != "DS_ACCELERATOR"}
    subprocess.run(  # the checkpoint: adapters on the built-in model, and their base
        [sys.executable, "-c", ADAPTERS, str(tmp_path)], env=inherited, check=True, timeout=300
    )
    result = subprocess.run(
        [sys.executable, "-m", "gspo_cli.cli", "export", str(tmp_path / "adapters"),
         str(tmp_path / "out")],
        capture_output=True, text=True, cwd=REPO, env=inherited, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "out" / "model.safetensors").is_file()
    assert "accelerator" not in result.stdout + result.stderr, result.stderr
