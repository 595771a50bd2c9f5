"""Reward binding: columns are passed by name, options bound, shared workers handed in."""

from __future__ import annotations

import pytest

from gspo_cli.core.errors import GspoError
from gspo_cli.recipe.reward import RewardConfig, RewardFunctionConfig
from gspo_cli.rewards.binding import RewardServices, bind_reward, reward_signature
from gspo_cli.rewards.code.reward import code_reward
from gspo_cli.rewards.math_verifier import MathVerifierPool, math_reward
from gspo_cli.train.step.rewards import WeightedRewards


def test_signatures_name_columns_options_and_services() -> None:
    math = reward_signature("math", math_reward)
    assert math.columns == ("answer",) and math.services == ("math_pool",)
    assert not math.options
    code = reward_signature("code", code_reward)
    assert code.columns == ("tests",) and code.services == ("judge_pool",)
    assert set(code.options) == {"partial_credit", "time_limit_s", "memory_limit_mb", "max_tests"}


def test_only_the_declared_columns_reach_the_function() -> None:
    with MathVerifierPool(1, 2.0) as pool:
        reward = bind_reward("math", {}, RewardServices(math_pool=pool))
        rows = [{"answer": "7", "prompt": "3+4", "id": 1}, {"answer": "2", "prompt": "1+1"}]
        assert reward(["\\boxed{7}", "\\boxed{3}"], rows) == [1.0, 0.0]


def test_the_math_reward_uses_the_pool_it_is_handed() -> None:
    """No first-caller-wins singleton: two pools of different sizes coexist."""
    with MathVerifierPool(1, 1.0) as small, MathVerifierPool(2, 3.0) as big:
        for pool in (small, big):
            cfg = RewardConfig(functions=[RewardFunctionConfig(name="math")])
            model = WeightedRewards(cfg, RewardServices(math_pool=pool))
            totals, correct, _ = model(["\\boxed{2}"], [{"answer": "2"}])[:3]
            assert totals == [1.0] and correct == [1.0]
            assert pool._pool is not None  # this pool did the work
        with pytest.raises(GspoError, match="needs math_pool"):
            WeightedRewards(RewardConfig(), RewardServices())


def test_a_missing_column_is_one_clear_error() -> None:
    with MathVerifierPool(1, 1.0) as pool:
        model = WeightedRewards(RewardConfig(), RewardServices(math_pool=pool))
        with pytest.raises(GspoError, match=r"reads column\(s\) answer, which the data"):
            model(["\\boxed{1}"], [{"solution": "1"}])
