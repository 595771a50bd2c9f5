"""`--hostfile`: what a malformed one says, in one line each, before any rank starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from gspo_cli.core.errors import GspoError
from gspo_cli.train.engines.multinode import read_hostfile
from tests.support.helpers import invoke_cli, one_error_line, write_recipe


def test_hosts_come_in_order_and_comments_are_skipped(tmp_path: Path) -> None:
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("# nodes\nnode-b slots=2\n\nnode-a slots=4\n")
    assert read_hostfile(hostfile, nproc=2) == ["node-b", "node-a"]


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b"\xff\xfe\x00binary", "not UTF-8 text (byte 0); a hostfile is `HOST slots=N` lines"),
        (b"node-a slots=2\nnode-a slots=2\n", "2: node-a is listed twice"),
        (b"node-a\n", "1: expected `HOST slots=N`, got 'node-a'"),
        (b"node-a slots=1\n", "1: --nproc 2 but node-a has slots=1"),
        (b"# only a comment\n", "no hosts (one `HOST slots=N` line per node)"),
    ],
)
def test_a_bad_hostfile_is_one_line(tmp_path: Path, content: bytes, expected: str) -> None:
    hostfile = tmp_path / "hostfile"
    hostfile.write_bytes(content)
    with pytest.raises(GspoError) as info:
        read_hostfile(hostfile, nproc=2)
    sep = ":" if expected[0].isdigit() else ": "
    assert str(info.value) == f"{hostfile}{sep}{expected}"


def test_gspo_train_refuses_it_before_making_the_run_folder(tmp_path: Path) -> None:
    hostfile = tmp_path / "hostfile"
    hostfile.write_bytes(b"\xff\xfe")
    recipe = write_recipe(tmp_path, {"trainer": {"engine": "deepspeed"}})
    out = tmp_path / "run"
    result = invoke_cli("train", str(recipe), "--out", str(out), "--hostfile", str(hostfile))
    one_error_line(result, f"{hostfile}: not UTF-8 text (byte 0)")
    assert not out.exists()
