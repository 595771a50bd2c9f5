"""Plain helpers the test modules share: the repository root, the CLI run in a subprocess or in
this process, small recipes, a process holding a folder's lock, the processes a run leaves
(from /proc), and known programs for the code reward. Light on purpose (no torch):
`tests/support/rl_helpers.py` holds the RL step's fakes.

Fixtures stay in the conftest files (pytest finds them there); those import from here too.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]


# --- the CLI ---------------------------------------------------------------------------------


def run_cli(
    *args: str,
    cwd: Path | None = None,
    timeout: float = 600,
    threads: int | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run the real `gspo` entry point in a subprocess, as a user would (`threads`: its
    OMP_NUM_THREADS, else inherited; `env`: more environment variables)."""
    env = {**os.environ, "COLUMNS": "200", **(env or {})}
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    return subprocess.run(
        [sys.executable, "-m", "gspo_cli.cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd or REPO,
        timeout=timeout,
        env=env,
    )


def invoke_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """Run `gspo ARGS` in this process, through the same entry point and error handling as the
    console script: a fast stand-in for `run_cli` where no process boundary is under test."""
    from gspo_cli.cli import main

    out, err = io.StringIO(), io.StringIO()
    code = 0
    argv = sys.argv
    sys.argv = ["gspo", *args]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        sys.argv = argv
    return subprocess.CompletedProcess(["gspo", *args], code, out.getvalue(), err.getvalue())


def gspo_train(recipe: Path | str, *args: str) -> subprocess.CompletedProcess[str]:
    """`gspo train RECIPE ARGS` in this process on one torch thread (`invoke_cli`) when it is
    one process of the plain-torch engine, else in a subprocess (`run_cli`): a subprocess costs
    ~6 CPU s of imports, and only a DeepSpeed run needs one (its process group and launcher
    variables would outlive the run here). For runs whose process boundary is not under test,
    and whose records are not compared bit for bit with a subprocess's."""
    import torch

    engine = (yaml.safe_load(Path(recipe).read_text()) or {}).get("trainer", {}).get("engine")
    launched = {"--nproc", "--hostfile"} & set(args) or any("trainer.engine=" in a for a in args)
    if launched or engine not in (None, "torch"):
        return run_cli("train", str(recipe), *args, threads=1)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as a subprocess of `make test` has, and each rank of --nproc
    try:
        return invoke_cli("train", str(recipe), *args)
    finally:
        torch.set_num_threads(threads)


def interruptible() -> None:
    """`preexec_fn` for a child a test sends Ctrl-C: a shell starts background jobs (and CI
    may start its runner) with SIGINT ignored, which a child would inherit and keep."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


# --- recipes ---------------------------------------------------------------------------------

# Small enough to train in seconds, easy enough that a short SFT gives mixed rewards.
TINY_TASK = {
    "data": {
        "arithmetic": {
            "num_train": 100,
            "num_eval": 16,
            "max_operand": 9,
            "min_ops": 1,
            "max_ops": 1,
            "unboxed_rate": 0.5,
        }
    },
    "rollout": {"num_prompts": 4, "group_size": 4, "max_new_tokens": 24},
    "eval": {"num_problems": 8, "samples": 2, "every": 100},
    "reward": {"num_workers": 1},
    "logging": {"console": "plain"},
}


def train_until_checkpoint(
    recipe: Path, out: Path, timeout: float = 300
) -> subprocess.Popen[bytes]:
    """`gspo train recipe --out out` in a child, returned once its first checkpoint is written
    (or it ended, or `timeout` passed): the caller kills it there."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "gspo_cli.cli", "train", str(recipe), "--out", str(out)],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    latest = out / "checkpoints" / "latest"
    deadline = time.monotonic() + timeout
    while not latest.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    return proc


def run_metrics(run: Path) -> dict[int, dict[str, Any]]:
    """A run folder's metrics.jsonl, by step."""
    import json

    lines = (run / "metrics.jsonl").read_text().splitlines()
    return {rec["step"]: rec for rec in map(json.loads, lines)}


def kill_during_run(command: list[str], out: Path, timeout: float = 600) -> int:
    """Run `gspo COMMAND` (a train into `out`) in its own session, SIGKILL the whole process
    group as soon as its first checkpoint is written; returns that checkpoint's step."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "gspo_cli.cli", *command],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # launcher and ranks die together (parent-death signals)
    )
    latest = out / "checkpoints" / "latest"
    deadline = time.monotonic() + timeout
    while not latest.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    return int(latest.read_text().strip().removeprefix("step_"))


# What two MoE runs must share (tests/integration/train/test_deepspeed_moe.py says why these
# tolerances): losses, norms, rewards and ratios to 1e-4 relative, expert volatility to 1e-6.
MOE_COMPARED = (
    "loss",
    "grad_norm",
    "reward_mean",
    "seq_ratio_mean",
    "token_ratio_mean",
    "clip_frac",
    "response_len_mean",
)
MOE_ROUTING = ("expert_volatility", "expert_volatility_update0", "expert_volatility_update1")


def first_forward_gaps(run: dict[int, dict[str, Any]]) -> list[float]:
    """`first_ratio_gap_max` of each step that trained: a step whose every group had zero
    advantage (all its rewards equal) skips its rows and has no training forward to measure.
    At least one step must have trained."""
    gaps = [m["first_ratio_gap_max"] for m in run.values() if "first_ratio_gap_max" in m]
    assert gaps, "no step of the run had a training forward"
    for metrics in run.values():
        assert "first_ratio_gap_max" in metrics or metrics["zero_adv_group_frac"] == 1.0
    return gaps


def assert_same_moe_runs(a: dict[int, dict[str, Any]], b: dict[int, dict[str, Any]]) -> None:
    """Run `b` reproduces run `a` step by step (metrics by step, as `run_metrics` reads them)."""
    import pytest

    assert any(a[s]["grad_norm"] > 0 for s in a), "no gradient signal: the test would be vacuous"
    assert any(a[s].get("expert_volatility", 0) > 0 for s in a), "no expert moved: vacuous"
    assert sorted(b) == sorted(a)
    for step in a:
        for key in (k for k in MOE_COMPARED if k in a[step] or k in b[step]):
            assert b[step][key] == pytest.approx(a[step][key], rel=1e-4, abs=1e-6), (step, key)
        # a step whose rows all had zero advantage trained nothing, and measured no volatility
        for key in MOE_ROUTING:
            assert (key in b[step]) == (key in a[step]), (step, key)
            if key in a[step]:
                assert b[step][key] == pytest.approx(a[step][key], abs=1e-6), (step, key)
        layers = [k for k in a[step] if k.startswith("expert_volatility_layer")]
        assert all(k in b[step] for k in layers)  # every layer's experts seen
        assert bool(layers) == ("expert_volatility" in a[step])


class TrainedRuns:
    """`gspo train` of one recipe under several command-line options, each set trained once
    per test run (`shared_once`: test modules and xdist workers share them): `runs(*options)`
    is the run's metrics by step. Options come in pairs (`--set K=V`, `--nproc N`), any order."""

    def __init__(self, recipe: Path, root: Path) -> None:
        self.recipe, self.root = recipe, root
        root.mkdir(exist_ok=True)

    def folder(self, *options: str) -> Path:
        pairs = sorted(zip(options[::2], options[1::2], strict=True))
        key = digest(self.recipe.read_text(), repr(pairs))

        def train(out: Path) -> None:
            # one torch thread, as the ranks of --nproc have (launch.py): the same kernels
            result = gspo_train(self.recipe, "--out", str(out), *options)
            assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]

        return shared_once(self.root, f"run-{key}", train)

    def __call__(self, *options: str) -> dict[int, dict[str, Any]]:
        return run_metrics(self.folder(*options))

    def assert_resume_is_exact(self, killed: Path, *options: str) -> None:
        """A run SIGKILLed after its first checkpoint, then `--resume`d into `killed`, logs
        every later step bit for bit as the straight run (`self(*options)`) did."""
        straight = self(*options)
        command = ["train", str(self.recipe), "--out", str(killed), *options]
        stopped_at = kill_during_run(command, killed)
        assert stopped_at < len(straight), "the run ended before it could be killed"
        result = run_cli(*command, "--resume")
        assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
        resumed = run_metrics(killed)
        assert sorted(resumed) == sorted(straight)
        for step in range(stopped_at + 1, len(straight) + 1):
            for key in (*MOE_COMPARED, *MOE_ROUTING):
                if key in straight[step]:
                    assert resumed[step][key] == straight[step][key], (step, key)  # bit for bit


# --- made once per test run -----------------------------------------------------------------


def digest(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


# Set by `make test` for the host suite and the vLLM tests beside it: one folder for both runs.
SHARED_ROOT = "GSPO_TEST_SHARED"


def shared_root(factory: Any) -> Path:
    """A folder every xdist worker of this test run shares (pytest's base temp is per worker),
    and the other pytest run `make test` starts beside it ($GSPO_TEST_SHARED): what
    `shared_once` makes lives there."""
    base = Path(factory.getbasetemp())
    shared = os.environ.get(SHARED_ROOT)
    root = (
        Path(shared)
        if shared
        else (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "shared"
    )
    root.mkdir(exist_ok=True)
    return root


def shared_once(root: Path, name: str, make: Callable[[Path], None]) -> Path:
    """`root/name`, made by `make(folder)` the first time any test (or worker) asks and reused
    after: a lock file serialises the makers, a marker written last says it is complete."""
    folder = root / name
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (root / f"{name}.done").exists():
            shutil.rmtree(folder, ignore_errors=True)
            make(folder)
            (root / f"{name}.done").touch()
    return folder


def cold_start(root: Path, overrides: dict[str, Any]) -> Path:
    """The checkpoint of the tiny task's cold start with `overrides` (a `cold_start` section
    among them), trained once per test run whatever asks for it: keyed by the recipe's digest,
    one torch thread (the same checkpoint whatever the machine's cores)."""
    import torch

    from gspo_cli.recipe import deep_merge, load_recipe
    from gspo_cli.runs.folder import COLD_START
    from gspo_cli.train.run.loop import run_sft_only

    text = yaml.safe_dump(deep_merge(TINY_TASK, overrides), sort_keys=True)

    def train(folder: Path) -> None:
        folder.mkdir(parents=True)
        recipe = write_recipe(folder, overrides)
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            run_sft_only(load_recipe(recipe), recipe.read_text(), run_dir=folder / "run")
        finally:
            torch.set_num_threads(threads)

    return shared_once(root, f"cold-start-{digest(text)}", train) / "run" / COLD_START


def write_recipe(folder: Path, overrides: dict[str, Any]) -> Path:
    """`folder/recipe.yaml`: the tiny task with `overrides` merged in."""
    from gspo_cli.recipe import deep_merge

    path = folder / "recipe.yaml"
    path.write_text(yaml.safe_dump(deep_merge(TINY_TASK, overrides)))
    return path


# --- a folder's one writer -------------------------------------------------------------------

# Holds the lock on argv[1] until killed; with argv[2] == "fork", first forks a child that
# outlives it (as a maths verifier worker would for a moment), and prints the child's pid once
# the child runs (its fork handlers done).
HOLDER = """
import os, sys, time
from pathlib import Path
from gspo_cli.runs.lock import one_writer
with one_writer(Path(sys.argv[1]), "gspo train"):
    if sys.argv[2] == "fork":
        ready, running = os.pipe()
        child = os.fork()
        if child == 0:
            os.write(running, b"x")
            time.sleep(120)
            os._exit(0)
        os.read(ready, 1)
        print(child, flush=True)
    print("held", flush=True)
    time.sleep(120)
"""


@contextmanager
def lock_holder(folder: Path, fork: bool = False) -> Iterator[tuple[subprocess.Popen[str], int]]:
    """A process holding `folder`'s lock: (the process, its forked child's pid or 0)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(folder), "fork" if fork else "-"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    try:
        child = int(proc.stdout.readline()) if fork else 0
        assert proc.stdout.readline().strip() == "held"
        yield proc, child
    finally:
        proc.kill()
        proc.wait()


# --- programs for the code reward ------------------------------------------------------------
# Written from the problem statements of the ../shared samples (tests/integration/
# test_code_judging.py judges them on their first few tests).

CARDS_ABC = """\
t = int(input())
for _ in range(t):
    s = input().strip()
    print("YES" if sum(a != b for a, b in zip(s, "abc")) <= 2 else "NO")
"""
SENIORS = """\
class Solution:
    def countSeniors(self, details: List[str]) -> int:
        return sum(int(d[11:13]) > 60 for d in details)
"""
TAKAHASHI_AOKI = """\
n = int(input())
s = input().strip()
t, a = s.count("T"), s.count("A")
if t != a:
    print("T" if t > a else "A")
else:  # tie: whoever reached the count first, i.e. did not win the last game
    print("A" if s[-1] == "T" else "T")
"""
GOOD = {
    "codeforces/1873_A": CARDS_ABC,
    "leetcode/2727": SENIORS,
    "atcoder/abc301_a": TAKAHASHI_AOKI,
}
BAD = {
    "codeforces/1873_A": "t = int(input())\nfor _ in range(t):\n    input()\n    print('YES')\n",
    "leetcode/2727": "class Solution:\n    def countSeniors(self, details):\n        return 0\n",
    "atcoder/abc301_a": "n = int(input())\ns = input()\nprint('T')\n",
}
# 12_B "Correct Solution?": is m the smallest number made of n's digits (no leading zero)?
SMALLEST_SHUFFLE = """\
n, m = input().strip(), input().strip()
digits = sorted(n)
if digits[0] == "0" and len(digits) > 1:
    first = next(i for i, d in enumerate(digits) if d != "0")
    digits[0], digits[first] = digits[first], digits[0]
print("OK" if "".join(digits) == m else "WRONG_ANSWER")
"""
# 1000_A "Codehorses T-shirts": equal-length valid sizes differ in one letter.
TSHIRTS = """\
from collections import Counter
n = int(input())
old = Counter(input().strip() for _ in range(n))
new = Counter(input().strip() for _ in range(n))
print(sum((old - new).values()))
"""


def fenced(code: str) -> str:
    """`code` as a model would answer: in a fenced block between two sentences."""
    return f"Here is my solution.\n```python\n{code}```\nIt runs in O(n)."


def one_error_line(result: subprocess.CompletedProcess[str], *parts: str) -> str:
    """The run's stderr is exactly one line, exit 2, no traceback, containing every `parts`."""
    assert result.returncode == 2, (result.returncode, result.stderr[-3000:])
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    for part in parts:
        assert part in lines[0], lines[0]
    return lines[0]


# --- processes ---------------------------------------------------------------------------------


def children(pid: int) -> list[int]:
    """Live (not zombie) processes whose parent is `pid`, from /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            state, ppid = (entry / "stat").read_text().rsplit(")", 1)[1].split()[:2]
        except (OSError, ValueError):
            continue  # it ended while we looked
        if int(ppid) == pid and state != "Z":
            found.append(int(entry.name))
    return found


def descendants(pid: int) -> list[int]:
    """`pid`'s children, theirs, and so on: a launcher's ranks and their workers."""
    found = children(pid)
    for child in list(found):
        found += descendants(child)
    return found


def alive(pids: list[int]) -> list[int]:
    alive = []
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z":  # a zombie is dead, waiting for init to reap it
            alive.append(pid)
    return alive


def marked(marker: str) -> list[int]:
    """Live processes whose argv holds `marker` (from /proc, as `pgrep -f` would): a `sleep`
    a user's code started with a number unique to its test."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue  # it ended while we looked
        if marker.encode() in argv and state != "Z":
            found.append(int(entry.name))
    return found


@contextmanager
def tool_module(
    folder: Path, monkeypatch: Any, name: str, source: str, function: str
) -> Iterator[Any]:
    """`source` as module `name`, importable from `folder` and loaded as the tools are
    (load_functions, by `function`), removed from sys.modules afterwards."""
    import textwrap

    from gspo_cli.rollout.tools.functions import load_functions

    (folder / f"{name}.py").write_text(textwrap.dedent(source))
    monkeypatch.syspath_prepend(str(folder))
    module = load_functions((f"{name}:{function}",))[function].__module__
    yield sys.modules[module]
    sys.modules.pop(module)


def kill_marked(marker: str) -> None:
    """Leave no `marked` process behind, whatever a test found."""
    for pid in marked(marker):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def survivors_of_sigkill(
    argv: list[str], marker: str, cwd: Path, timeout: float = 300
) -> list[int]:
    """Start `argv` (a trainer); once a process holding `marker` runs, SIGKILL the trainer (no
    cleanup runs in it) and return the marked processes still alive 30 s later (a bounded
    wait, not a timed one). Nothing marked is left running afterwards."""
    trainer = subprocess.Popen(
        argv,
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + timeout
        while not marked(marker) and trainer.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert marked(marker), f"nothing marked {marker} ever started"
        trainer.kill()
        trainer.wait()
        return wait_gone(marked(marker), timeout=30)
    finally:
        trainer.kill()
        kill_marked(marker)


def wait_gone(pids: list[int], timeout: float = 60) -> list[int]:
    """The pids still alive once all have ended or `timeout` passed (not a timing assert)."""
    deadline = time.monotonic() + timeout
    while alive(pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return alive(pids)
