"""What an RL step reports: its metrics, folded from micro-batches and the scored groups."""

from __future__ import annotations

import math

import torch

from gspo_cli.algorithms import mismatch_metrics
from gspo_cli.algorithms.advantages import zero_signal_groups
from gspo_cli.rollout.batch import RolloutBatch
from gspo_cli.train.engines.metric_rules import combine, tool_error_share
from gspo_cli.train.step.micro import StepPlan
from gspo_cli.train.step.scored import ScoredGroups
from gspo_cli.train.step.settings import LossSettings, StepSettings


def add_mismatch(
    parts: dict[str, list[float]],
    logprobs: torch.Tensor,
    engine_lp: torch.Tensor,
    mask: torch.Tensor,
    loss: LossSettings,
) -> None:
    """Engine-vs-trainer mismatch from a forward taken before any update of this step."""
    metrics = mismatch_metrics(
        logprobs.detach(), engine_lp.to(logprobs.device), mask, loss.clip_low, loss.clip_high
    )
    for key, value in metrics.items():
        parts[key].append(value)


def count_skipped_rows(
    summary: dict[str, float],
    plan: StepPlan,
    loss_mask: torch.Tensor,
    advantages: torch.Tensor,
    in_loss: torch.Tensor,
) -> None:
    """Clip fractions stay shares of ALL response tokens, as without skipping (a skipped,
    zero-advantage token is never clipped), and the zero-advantage share is over all rows.
    Ratio statistics and entropy are over the trained tokens. The skipped share counts rows
    in the loss only (`in_loss` `[N]`): masked truncations and filling groups are not skips."""
    rows_in_loss = int(in_loss.sum())
    summary["zero_adv_skipped_frac"] = 1.0 - plan.trained_rows / max(rows_in_loss, 1)
    if plan.trained_rows == len(advantages):
        return
    trained = [m.rows for micro in plan.minibatches for m in micro if not m.filler]
    rows = torch.cat(trained) if trained else torch.zeros(0, dtype=torch.long)
    share = float(loss_mask[rows].sum() / loss_mask.sum().clamp(min=1))
    for key in ("clip_frac", "clip_frac_low", "clip_frac_high"):
        summary[key] = summary.get(key, 0.0) * share
    summary["zero_adv_seq_frac"] = float((advantages == 0).float().mean())


def shaping_metrics(scored: ScoredGroups, settings: StepSettings) -> dict[str, float]:
    """DAPO's overlong penalty (mean, share penalised) and truncation masking (share masked),
    each only when on."""
    out: dict[str, float] = {}
    if settings.overlong_buffer:
        penalty = torch.tensor(scored.overlong, dtype=torch.float32)  # [N]
        out["overlong_penalty_mean"] = float(penalty.mean())
        out["overlong_penalised_frac"] = float((penalty < 0).float().mean())
    if settings.algorithm.mask_truncated:
        truncated = torch.tensor(scored.rollout.truncated, dtype=torch.bool)  # [N]
        kept = scored.loss_rows(mask_truncated=False)  # [N] the groups in the loss
        out["truncated_masked_frac"] = float((truncated & kept).sum() / kept.sum().clamp(min=1))
    return out


def summarise(
    parts: dict[str, list[float]],
    scored: ScoredGroups,
    rewards: torch.Tensor,
    group_size: int,
    advantages: torch.Tensor,
    time_train_s: float,
    lr: float,
) -> dict[str, float]:
    rollout, correct = scored.rollout, scored.correct
    lengths = torch.tensor([len(c) for c in rollout.completion_ids], dtype=torch.float32)
    out: dict[str, float] = {}
    tokens = parts.pop("response_tokens", [])
    for key, values in parts.items():
        # Per-micro-batch values weigh by their tokens; a whole-batch value stands alone.
        weights = tokens if len(values) == len(tokens) else [1.0] * len(values)
        out[key] = combine(key, values, weights)
    out["response_tokens"] = sum(tokens) / max(1, len(parts["grad_norm"]))  # per pass
    time_step_s = scored.time_rollout_s + scored.time_reward_s + time_train_s
    out.update(
        reward_mean=float(rewards.mean()),
        reward_std=float(rewards.std(unbiased=False)),
        accuracy=sum(correct) / len(correct),
        advantage_abs_mean=float(advantages.abs().mean()),
        zero_adv_groups=float(zero_signal_groups(advantages, group_size).sum()),
        zero_adv_group_frac=float(zero_signal_groups(advantages, group_size).float().mean()),
        response_len_mean=float(lengths.mean()),
        response_len_max=float(lengths.max()),
        truncated_frac=float(torch.tensor(rollout.truncated, dtype=torch.float32).mean()),
        lr=lr,
        time_rollout_s=scored.time_rollout_s,
        time_reward_s=scored.time_reward_s,
        time_train_s=time_train_s,
        time_step_s=time_step_s,
        completion_tokens=float(rollout.num_completion_tokens),
        tokens_per_s=rollout.num_completion_tokens / max(time_step_s, 1e-9),
    )
    out.update(tool_metrics(rollout))
    out.update(form_metrics(scored))
    return out


def form_metrics(scored: ScoredGroups) -> dict[str, float]:
    """`answered` (share in the expected answer form) and `accuracy_any_form` (maths: share
    right in any form) of the step's responses, beside the strict `accuracy`; each only when
    the reward measured it (rewards/answer_forms.py)."""
    out: dict[str, float] = {}
    for key, values in (
        ("answered", scored.answered),
        ("accuracy_any_form", scored.correct_any_form),
    ):
        measured = [v for v in values or [] if not math.isnan(v)]
        if measured:
            out[key] = sum(measured) / len(measured)
    return out


def tool_metrics(rollout: RolloutBatch) -> dict[str, float]:
    """Tool use (rollout.tools): calls, failed calls and calls refused past max_calls (counts
    and per response), the failed share, tool seconds, results cut to output_max_tokens,
    interpreter sessions a call ended,
    trajectories a result did not fit in, tool tokens per response; {} without tools. Counts
    add up over ranks and the failed share is taken from them (train/engines/metric_rules.py)."""
    traces = rollout.tool_traces
    if not traces:
        return {}
    n = len(traces)
    out = {
        "tool_calls": float(sum(t.calls for t in traces)),
        "tool_errors": float(sum(t.errors for t in traces)),
        "tool_refused": float(sum(t.refused for t in traces)),
        "tool_calls_per_response": sum(t.calls for t in traces) / n,
        "tool_errors_per_response": sum(t.errors for t in traces) / n,
        "tool_time_s": sum(t.seconds for t in traces),
        "tool_outputs_cut": float(sum(t.cut_outputs for t in traces)),
        "tool_session_restarts": float(sum(t.session_restarts for t in traces)),
        "tool_budget_ended_frac": sum(t.ended_by_budget for t in traces) / n,
        "tool_tokens_per_response": sum(t.tool_tokens for t in traces) / n,
    }
    return {**out, **tool_error_share(out)}
