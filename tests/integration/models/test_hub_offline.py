"""A hub id with no hub: one line naming HF_HUB_OFFLINE at once, not ~50 s of silent retries;
a model already in the hub cache still loads."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gspo_cli.models import load_policy
from tests.support.helpers import REPO

# Connection refused at once, on any machine, with or without a network.
UNREACHABLE = "http://127.0.0.1:9"
COMMIT = "0" * 40

LOAD = """
import sys
from gspo_cli.core.errors import GspoError
from gspo_cli.models.loading import load_policy
for path in sys.argv[1:]:
    try:
        model, _ = load_policy(path)
        print("loaded", path, type(model).__name__)
    except GspoError as exc:
        print(exc)
"""


def load_in_subprocess(cache: Path, env: dict[str, str], *paths: str) -> tuple[list[str], str]:
    """stdout lines and stderr of loading `paths` in a fresh process (hub settings are read
    when huggingface_hub is imported)."""
    clean = {
        k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    }
    result = subprocess.run(
        [sys.executable, "-c", LOAD, *paths],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=600,
        env={**clean, "HF_HUB_CACHE": str(cache), "HF_HUB_VERBOSITY": "warning", **env},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.strip().splitlines(), result.stderr


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A hub cache holding one model, `cached/tiny`, laid out as huggingface_hub writes it."""
    root = tmp_path_factory.mktemp("hub-cache")
    repo = root / "models--cached--tiny"
    snapshot = repo / "snapshots" / COMMIT
    model, tokenizer = load_policy("builtin:tiny-dense")
    model.save_pretrained(snapshot)
    tokenizer.save_pretrained(snapshot)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    return root


def test_an_unreachable_hub_is_one_line_naming_hf_hub_offline(cache: Path) -> None:
    lines, stderr = load_in_subprocess(
        cache, {"HF_ENDPOINT": UNREACHABLE}, "someorg/somemodel", "cached/tiny"
    )
    assert lines[0].startswith(
        "model.path: 'someorg/somemodel' is neither a local folder nor in the local hub cache, "
        f"and the hub at {UNREACHABLE} is unreachable ("
    )
    assert "set HF_HUB_OFFLINE=1 to skip the hub" in lines[0]
    assert lines[1] == "loaded cached/tiny Qwen3ForCausalLM"  # the cache is still used
    assert "Retrying" not in stderr  # one probe, not huggingface_hub's five retries per file


def test_hf_hub_offline_fails_at_once_with_one_line(cache: Path) -> None:
    lines, stderr = load_in_subprocess(
        cache, {"HF_HUB_OFFLINE": "1"}, "someorg/somemodel", "cached/tiny"
    )
    assert lines == [
        "model.path: 'someorg/somemodel' is neither a local folder nor in the local hub cache, and "
        "HF_HUB_OFFLINE is set: unset HF_HUB_OFFLINE to download it, or point model.path at a "
        "local folder",
        "loaded cached/tiny Qwen3ForCausalLM",
    ]
    assert "Retrying" not in stderr
