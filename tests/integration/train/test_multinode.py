"""`gspo train --hostfile` across two "nodes" on this machine: a private sshd on 127.0.0.1 under
the host names node-a and node-b (scripts/two_node_localhost.sh), DeepSpeed's pdsh launcher,
gloo between the ranks, one shared run folder. World size 2, as `--nproc 2` on one node."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.helpers import REPO, alive, wait_gone, write_recipe

pytest.importorskip("deepspeed")
pytestmark = pytest.mark.slow

SCRIPT = REPO / "scripts" / "two_node_localhost.sh"
STEPS = 4
COMPARED = ("loss", "grad_norm", "reward_mean", "seq_ratio_mean", "clip_frac", "response_len_mean")
GSPO = [sys.executable, "-m", "gspo_cli.cli"]
NEEDED = ("/usr/sbin/sshd", "ssh", "ssh-keygen", "pdsh", "setpriv")


def _metrics(run: Path) -> dict[int, dict[str, float]]:
    return {r["step"]: r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())}


def _same(a: dict[int, dict[str, float]], b: dict[int, dict[str, float]]) -> None:
    assert sorted(a) == sorted(b) == list(range(1, STEPS + 1))
    for step in a:
        for key in (k for k in COMPARED if k in a[step] or k in b[step]):
            assert b[step][key] == pytest.approx(a[step][key], rel=1e-4, abs=1e-6), (step, key)


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The folder with `hostfile` (node-a slots=1, node-b slots=1) and `bin/ssh` (ssh that
    knows both names), while the sshd serving them runs."""
    missing = [tool for tool in NEEDED if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"needs {', '.join(missing)} (apt install openssh-server pdsh util-linux)")
    folder = tmp_path_factory.mktemp("nodes")
    started = subprocess.run(
        [str(SCRIPT), "start", str(folder)], capture_output=True, text=True, timeout=120
    )
    if started.returncode == 3:  # the script's "cannot here": no sshd, or it would not start
        said = (started.stderr.strip().splitlines() or ["no reason given"])[-1]
        pytest.skip(f"no sshd on localhost: {said}")
    assert started.returncode == 0, started.stdout + started.stderr
    yield folder
    subprocess.run([str(SCRIPT), "stop", str(folder)], check=True, timeout=60)


def _env(nodes: Path) -> dict[str, str]:
    return {**os.environ, "PATH": f"{nodes / 'bin'}:{os.environ['PATH']}", "COLUMNS": "200"}


@pytest.fixture(scope="module")
def recipe(
    nodes: Path, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """The tiny task on DeepSpeed ZeRO-2; asked for only once `nodes` is up, so that a machine
    without sshd skips before the cold-started checkpoint is built."""
    sft_checkpoint = request.getfixturevalue("sft_checkpoint")
    folder = tmp_path_factory.mktemp("multinode")
    return write_recipe(
        folder,
        {
            "model": {"path": str(sft_checkpoint)},
            "trainer": {
                "steps": STEPS,
                "checkpoint_every": 2,
                "engine": "deepspeed",
                "out_dir": str(folder / "runs"),
            },
            "deepspeed": {"zero_stage": 2},
            "algorithm": {"minibatches": 2},
            "rollout": {"seed_per_prompt": True},
        },
    )


def _gspo(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [*GSPO, *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=900,
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    return result


@pytest.fixture(scope="module")
def one_node(recipe: Path) -> Path:
    """The same world size on one node: `--nproc 2`, torchrun."""
    out = recipe.parent / "runs" / "one-node"
    _gspo("train", str(recipe), "--out", str(out), "--nproc", "2")
    return out


def _processes_of(run: Path) -> list[int]:
    """Live processes whose command line names this run folder: launchers, ranks, workers, the
    ssh clients and the remote shells (this test's own pytest process excepted)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                command = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
            except OSError:
                continue  # it ended while we looked
            if str(run).encode() in command:
                found.append(int(entry.name))
    return alive(found)


def _left_behind(run: Path) -> list[int]:
    """What is still alive of this run 30 s after its launcher went (each killed: by pid)."""
    left = wait_gone(_processes_of(run), timeout=30)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    return left


def _start(recipe: Path, out: Path, nodes: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*GSPO, "train", str(recipe), "--out", str(out), "--hostfile", str(nodes / "hostfile")],
        cwd=REPO,
        env=_env(nodes),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def _wait_for(path: Path, proc: subprocess.Popen[str], timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)


def test_two_nodes_reproduce_one_node(recipe: Path, nodes: Path, one_node: Path) -> None:
    out = recipe.parent / "runs" / "two-nodes"
    hostfile = str(nodes / "hostfile")
    result = _gspo("train", str(recipe), "--out", str(out), "--hostfile", hostfile, env=_env(nodes))
    log = result.stdout + result.stderr
    assert "node-a: " in log and "node-b: " in log, log[-3000:]  # a launcher on each host
    assert log.count("gspo train run: ") == 1, log[-3000:]  # the summary once, not per rank
    a, b = _metrics(one_node), _metrics(out)
    assert any(a[s]["grad_norm"] > 0 for s in a), "no gradient signal: the test would be vacuous"
    _same(a, b)
    assert len((out / "metrics.jsonl").read_text().splitlines()) == STEPS  # rank 0 alone writes
    checkpoints = out / "checkpoints"
    assert sorted(p.name for p in checkpoints.glob("step_*")) == ["step_000002", "step_000004"]
    for step in checkpoints.glob("step_*"):  # one HF export, and each rank's ZeRO-2 shard
        assert (step / "config.json").is_file() and (step / "model.safetensors").is_file()
        shards = sorted(p.name for p in (step / "deepspeed" / "state").glob("zero_pp_rank_*"))
        assert shards == [f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in (0, 1)]
    assert not _processes_of(out)


def test_a_killed_launcher_ends_every_rank_and_the_run_resumes(
    recipe: Path, nodes: Path, one_node: Path, tmp_path: Path
) -> None:
    out = tmp_path / "killed"
    proc = _start(recipe, out, nodes)
    latest = out / "checkpoints" / "latest"
    _wait_for(latest, proc)
    ranks = [pid for pid in _processes_of(out) if pid != proc.pid]
    os.killpg(proc.pid, signal.SIGKILL)  # gspo train, its launcher, pdsh: nothing cleans up
    proc.communicate()
    assert len(ranks) >= 4, "launchers and ranks on both nodes, seen before the kill"
    assert _left_behind(out) == []  # the remote ranks ended with their ssh connections
    stopped_at = int(latest.read_text().strip().removeprefix("step_"))
    assert stopped_at < STEPS, "the run ended before it could be killed"
    hostfile = str(nodes / "hostfile")
    _gspo(
        "train", str(recipe), "--out", str(out), "--hostfile", hostfile, "--resume", env=_env(nodes)
    )
    _same(_metrics(one_node), _metrics(out))
    assert not _processes_of(out)


def test_a_stop_signal_ends_the_ranks_with_one_line(
    recipe: Path, nodes: Path, tmp_path: Path
) -> None:
    out = tmp_path / "stopped"
    proc = _start(recipe, out, nodes)
    _wait_for(out / "metrics.jsonl", proc)
    proc.send_signal(signal.SIGTERM)  # to gspo train alone, as a scheduler would
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 143, output[-3000:]
    assert output.rstrip().splitlines()[-1].startswith("stopped at step "), output[-3000:]
    assert "--hostfile" in output.rstrip().splitlines()[-1]  # the resume command keeps it
    assert _left_behind(out) == []


@pytest.mark.parametrize("answer", ["refused", "silent"])
def test_an_unreachable_host_is_one_line_not_a_hang(answer: str, tmp_path: Path) -> None:
    """A host whose port refuses, or accepts and never speaks: exit 2 within ssh's connect
    timeout (10 s), before any rank starts. No sshd needed."""
    if shutil.which("pdsh") is None or shutil.which("ssh") is None:
        pytest.skip("needs ssh and pdsh")
    recipe = write_recipe(tmp_path, {"trainer": {"engine": "deepspeed"}})
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        if answer == "silent":
            listener.listen()
        port = listener.getsockname()[1]
        (tmp_path / "ssh_config").write_text(
            f"Host node-dead\n  HostName 127.0.0.1\n  Port {port}\n  StrictHostKeyChecking no\n"
        )
        (tmp_path / "bin").mkdir()
        wrapper = tmp_path / "bin" / "ssh"
        wrapper.write_text(f'#!/bin/sh\nexec {shutil.which("ssh")} -F {tmp_path}/ssh_config "$@"\n')
        wrapper.chmod(0o755)
        hostfile = tmp_path / "hostfile"
        hostfile.write_text("node-dead slots=1\n")
        started = time.monotonic()
        result = subprocess.run(
            [
                *GSPO,
                "train",
                str(recipe),
                "--out",
                str(tmp_path / "run"),
                "--hostfile",
                str(hostfile),
            ],
            capture_output=True,
            text=True,
            cwd=REPO,
            env=_env(tmp_path),
            timeout=120,
        )
    assert result.returncode == 2, result.stdout + result.stderr
    assert time.monotonic() - started < 60
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --hostfile: cannot reach node-dead")
