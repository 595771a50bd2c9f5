"""The libraries' own progress bars, info logs and warnings a user can do nothing about, quieted
at the command's start (gspo's own progress display replaces them)."""

from __future__ import annotations

import os
import sys
import warnings


def quiet_libraries() -> None:
    """Our own progress display replaces the libraries' bars and info logs."""

    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_VERBOSITY", "error")
    os.environ.setdefault("DATASETS_VERBOSITY", "error")
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if "datasets" in sys.modules:  # imported already (a host process): the variable came late
        sys.modules["datasets"].disable_progress_bars()
    # DeepSpeed 0.19's ZeRO calls this, deprecated in torch 2.13: one warning per rank per run
    # that a user can do nothing about.
    warnings.filterwarnings(
        "ignore",
        message=r"`torch\.distributed\.all_gather_into_tensor` is deprecated",
        category=FutureWarning,
    )
