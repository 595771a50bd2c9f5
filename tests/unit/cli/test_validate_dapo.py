"""Bad DAPO settings stop `gspo validate` with one line each and exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.helpers import invoke_cli


@pytest.mark.parametrize(
    "text,expected",
    [
        (
            "rollout: {dynamic_sampling_max_rounds: 0}\n",
            "rollout.dynamic_sampling_max_rounds: Input should be greater than or equal to 1",
        ),
        (
            "rollout: {max_new_tokens: 32}\nreward: {overlong_buffer: 40}\n",
            "reward.overlong_buffer (40) must be less than rollout.max_new_tokens (32)",
        ),
        (
            "reward: {overlong_penalty: -0.5}\n",
            "reward.overlong_penalty: Input should be greater than or equal to 0",
        ),
    ],
)
def test_bad_dapo_settings_exit_2_with_one_line(tmp_path: Path, text: str, expected: str) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    result = invoke_cli("validate", str(bad))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], result.stderr
