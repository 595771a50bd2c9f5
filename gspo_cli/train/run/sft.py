"""Cold start: supervised fine-tuning on worked solutions before RL, as the paper's SFT model.

The loss is the mean cross-entropy over solution tokens (the prompt is context only). A row's
target is its `solution`: a column, or the final assistant turn of a conversation
(data/formats.py); with `cold_start.target: answer`, its reference answer alone, boxed.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from gspo_cli.core.errors import GspoError
from gspo_cli.data.formats import SOLUTION_KEY
from gspo_cli.recipe.trainer import ColdStartConfig
from gspo_cli.rewards.extract import boxed
from gspo_cli.train.engines.schedule import lr_lambda


def _encode(
    tokenizer: PreTrainedTokenizerBase, prompt_ids: list[int], solution: str
) -> tuple[list[int], list[int]]:
    answer = list(tokenizer(solution, add_special_tokens=False)["input_ids"])
    answer.append(int(tokenizer.eos_token_id))
    return prompt_ids + answer, [0] * len(prompt_ids) + [1] * len(answer)


def _collate(examples: list[tuple[list[int], list[int]]], pad_id: int) -> dict[str, torch.Tensor]:
    width = max(len(ids) for ids, _ in examples)
    input_ids = torch.full((len(examples), width), pad_id, dtype=torch.long)  # [B, L]
    attention = torch.zeros_like(input_ids)  # [B, L], right padding
    target_mask = torch.zeros_like(input_ids)  # [B, L], 1 on solution tokens
    for i, (ids, mask) in enumerate(examples):
        input_ids[i, : len(ids)] = torch.tensor(ids)
        attention[i, : len(ids)] = 1
        target_mask[i, : len(ids)] = torch.tensor(mask)
    return {"input_ids": input_ids, "attention_mask": attention, "target_mask": target_mask}


def imitation_target(row: dict[str, Any], target: str) -> str | None:
    """What the cold start trains on for one row (None: it has nothing to imitate)."""
    if target == "solution":
        solution = row.get(SOLUTION_KEY)
        return None if solution is None else str(solution)
    answer = row.get("answer")
    # A code task's answer is its tests, and a list or mapping is no single boxed answer.
    if row.get("tests") is not None or not isinstance(answer, str | int | float):
        return None
    return boxed(str(answer)) if str(answer).strip() else None


def cold_start(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompt_ids: list[list[int]],
    rows: list[dict[str, Any]],
    cfg: ColdStartConfig,
    seed: int,
    on_step: Callable[[int, float], None] | None = None,
) -> list[float]:
    """Fine-tune `model` in place for `cfg.steps` steps; returns the loss of each step."""
    texts = [imitation_target(row, cfg.target) for row in rows]
    missing = next((i for i, text in enumerate(texts) if text is None), None)
    if missing is not None and cfg.target == "answer":
        raise GspoError(
            f"cold_start: training row {missing} has no single reference answer to box "
            "(cold_start.target: answer): a code task, a task that accepts several answers, "
            "a list or mapping for an answer, or an empty answer column"
        )
    if missing is not None:
        raise GspoError(
            f"cold_start: training row {missing} has no 'solution' to imitate: give the data a "
            "'solution' column, or conversations that end with the assistant's turn, or set "
            "cold_start.target: answer to imitate the boxed reference answer alone"
        )
    examples = [_encode(tokenizer, p, str(t)) for p, t in zip(prompt_ids, texts, strict=True)]
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
    warmup = max(1, cfg.steps // 20)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lr_lambda("cosine", warmup, cfg.steps, 0.1)
    )
    rng = random.Random(seed)
    device = next(model.parameters()).device
    model.train()
    losses: list[float] = []
    for step in range(cfg.steps):
        batch = _collate(
            rng.sample(examples, min(cfg.batch_size, len(examples))), int(tokenizer.pad_token_id)
        )
        batch = {k: v.to(device) for k, v in batch.items()}
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        targets = batch["input_ids"][:, 1:]  # [B, L-1]
        mask = batch["target_mask"][:, 1:].float()  # [B, L-1]
        token_loss = torch.nn.functional.cross_entropy(
            logits[:, :-1].float().reshape(-1, logits.shape[-1]),
            targets.reshape(-1),
            reduction="none",
        ).view_as(mask)
        loss = (token_loss * mask).sum() / mask.sum()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
        if on_step is not None:
            on_step(step + 1, losses[-1])
    return losses
