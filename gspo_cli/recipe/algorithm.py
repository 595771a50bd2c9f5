"""The recipe's algorithm section: the policy loss, its clip ranges, KL and corrections."""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Literal

from pydantic import Field, field_validator, model_validator

from gspo_cli.recipe.section import Section, registered

if TYPE_CHECKING:
    from gspo_cli.algorithms import LossOptions

# IcePop's band [alpha, beta] in Ring-1T (arXiv 2510.18855): the paper's default
ICEPOP_BAND = (0.5, 5.0)

BUILTIN_PREFIX = "builtin:"  # models/builtin.py's; a string here keeps torch out of validation


class DistillConfig(Section):
    """On-policy distillation (docs/distillation.md): a frozen teacher scores the student's
    samples; each model token's advantage is log pi_T - log pi_old, mixed with the task's."""

    teacher: str = Field(
        description="The teacher: any model path gspo loads (builtin:NAME, an HF folder or hub "
        "id, a .gguf file, a checkpoint); its tokenizer must be the student's. Checked (it "
        "exists, its tokenizer) by gspo validate and gspo train, not when a recipe is read."
    )
    coef: float = Field(1.0, gt=0, description="Weight of the reverse-KL advantage a_t.")
    task_reward_coef: float = Field(
        0.0,
        ge=0,
        description="Weight of the rewards' group advantage A_i in A_t = task_reward_coef x A_i "
        "+ coef x a_t; 0 = pure distillation.",
    )
    seed: int | None = Field(
        None,
        description="Seed of a seeded built-in teacher (builtin:tiny-dense...); None: "
        "trainer.seed. Other teachers have no seed.",
    )

    @model_validator(mode="after")
    def _seed_needs_builtin(self) -> DistillConfig:
        if self.seed is not None and not self.teacher.startswith(BUILTIN_PREFIX):
            raise ValueError(
                f"algorithm.distill.seed has no effect with teacher {self.teacher}: only a "
                "built-in teacher is seeded"
            )
        return self


class AlgorithmConfig(Section):
    name: str = Field(
        "gspo",
        description="Policy loss: gspo, gspo_token, grpo, luspo, sapo, gmpo, cispo, dppo_tv, "
        "dppo_kl or vespo (registered; docs/options/successor-losses.md, off-policy.md).",
    )
    clip_low: float | None = Field(
        None,
        gt=0,
        description="eps_low; None takes the paper's (3e-4 GSPO, 0.2 GRPO, 2e-3 LUSPO, 1 = none "
        "CISPO); GMPO: a log-space bound (0.4); DPPO: the trust region's delta (0.15 TV, 0.05 KL); "
        "SAPO, VESPO: unused.",
    )
    clip_high: float | None = Field(
        None,
        gt=0,
        description="eps_high; None takes the paper's (4e-4 GSPO, 0.27 GRPO, 2.5e-3 LUSPO, 0.2 "
        "CISPO); GMPO: a log-space bound (0.4); DPPO: the trust region's delta (0.15 TV, 0.05 KL); "
        "SAPO, VESPO: unused.",
    )
    loss_agg: str | None = Field(
        None,
        description="Loss aggregation: seq_mean_token_mean, token_mean or seq_mean_token_sum "
        "(registered); None takes the algorithm's paper's (token_mean for CISPO, "
        "seq_mean_token_mean otherwise; LUSPO allows only that).",
    )
    sapo_tau_pos: float = Field(
        1.0, gt=0, description="SAPO: gate temperature for tokens with advantage > 0."
    )
    sapo_tau_neg: float = Field(
        1.05, gt=0, description="SAPO: gate temperature for the others (paper: > tau_pos)."
    )
    vespo_k_pos: float = Field(
        2.0, gt=0, description="VESPO: the kernel W^k e^{lambda (1 - W)}'s k for A >= 0 (c1)."
    )
    vespo_lambda_pos: float = Field(3.0, gt=0, description="VESPO: its lambda for A >= 0.")
    vespo_k_neg: float = Field(3.0, gt=0, description="VESPO: k for A < 0.")
    vespo_lambda_neg: float = Field(2.0, gt=0, description="VESPO: lambda for A < 0.")
    scale_advantages: bool = Field(True, description="Divide advantages by the group std.")
    mask_truncated: bool = Field(
        False,
        description="DAPO overlong filtering: responses cut at rollout.max_new_tokens leave the "
        "loss and its normalisers (they still count in their group's reward mean and std).",
    )
    kl_coef: float = Field(0.0, ge=0, description="KL penalty to the initial policy; 0 = off.")
    rollout_correction: str = Field(
        "off",
        description="Off-policy correction for engine-vs-trainer mismatch: off, token_tis, "
        "seq_mask, seq_truncate or icepop (registered; see docs/options/off-policy.md).",
    )
    correction_cap: float = Field(
        2.0,
        gt=1,
        description="C: token_tis / seq_truncate cap weights at C; seq_mask keeps [1/C, C].",
    )
    correction_band: tuple[float, float] = Field(
        ICEPOP_BAND,
        description="icepop's [alpha, beta]: a token whose pi_old / pi_engine leaves it is "
        "masked from the gradient (Ring-1T's [0.5, 5]; 0 < alpha <= 1 <= beta).",
    )
    minibatches: int = Field(4, ge=1, description="Optimiser steps per rollout batch.")
    routing_replay: Literal["off", "old_policy", "rollout"] = Field(
        "off",
        description="MoE Routing Replay: force each token's experts in the training forwards to "
        "those of the pi_old forward (old_policy, the paper's R2) or of generation (rollout, R3; "
        "HF engine). Dense models ignore it.",
    )
    router_aux_coef: float = Field(
        0.0,
        ge=0,
        description="Weight of the MoE router's own load-balancing loss added to the policy "
        "loss; 0 = off (the paper trains without it).",
    )
    kl_estimator: str = Field(
        "k3",
        description="Per-token KL estimator: k1, k2, k3 or low_var_kl (registered; see "
        "docs/options/kl-and-entropy.md).",
    )
    kl_in: Literal["loss", "reward"] = Field(
        "loss",
        description="Where kl_coef applies the KL: loss (per token, with gradient) or reward "
        "(each response's reward minus kl_coef x its summed KL(pi_old || ref), no gradient).",
    )
    ref_update_every: int = Field(
        0,
        ge=0,
        description="Refresh the KL reference to the current policy every N steps; 0 = it stays "
        "the initial policy.",
    )
    distill: DistillConfig | None = Field(
        None,
        description="On-policy distillation from a teacher (teacher, coef, task_reward_coef); "
        "None = off.",
    )
    sequence_unit: Literal["trajectory", "turn"] = Field(
        "trajectory",
        description="Tool trajectories: GSPO's sequence is all the model tokens of a trajectory "
        "(one ratio, the rewarded unit), or each model turn with the trajectory's advantage "
        "(docs/tools.md). Without tools both are the response.",
    )
    entropy_coef: float = Field(
        0.0,
        ge=0,
        description="c_H of the entropy bonus L = L_pg - c_H x H (aggregated like the policy "
        "loss); 0 = off.",
    )

    _name_registered = field_validator("name")(partial(registered, "algorithm"))
    _kl_registered = field_validator("kl_estimator")(partial(registered, "kl estimator"))
    _correction_registered = field_validator("rollout_correction")(
        partial(registered, "rollout correction")
    )

    @field_validator("correction_band")
    @classmethod
    def _band_in_order(cls, band: tuple[float, float]) -> tuple[float, float]:
        alpha, beta = band
        if not (0 < alpha <= 1 <= beta < float("inf")):
            raise ValueError(
                f"correction_band [{alpha}, {beta}] must hold 1 with 0 < alpha <= 1 <= beta "
                "(finite): a token at ratio 1, where the engines agree, is never masked"
            )
        return band

    @model_validator(mode="after")
    def _band_is_icepops(self) -> AlgorithmConfig:
        if "correction_band" in self.model_fields_set and self.rollout_correction != "icepop":
            raise ValueError(
                f"correction_band is icepop's band; rollout_correction is "
                f"{self.rollout_correction} (its bound is correction_cap)"
            )
        return self

    @field_validator("loss_agg")
    @classmethod
    def _agg_registered(cls, name: str | None) -> str | None:
        return None if name is None else registered("loss aggregation", name)

    @model_validator(mode="after")
    def _paper_clip_defaults(self) -> AlgorithmConfig:
        from gspo_cli.algorithms import LOSS_SPECS, resolve_loss_agg

        low, high = LOSS_SPECS.get(self.name).paper_clip
        if self.clip_low is None:
            self.clip_low = low
        if self.clip_high is None:
            self.clip_high = high
        agg = resolve_loss_agg(self.name, self.loss_agg)  # the paper's; raises if unsupported
        if self.loss_agg != agg:
            self.loss_agg = agg
        for loss, prefix in (("sapo", "sapo_tau_"), ("vespo", "vespo_")):
            knobs = [key for key in self.model_fields_set if key.startswith(prefix)]
            if knobs and self.name != loss:
                raise ValueError(f"{sorted(knobs)[0]} has no effect with name {self.name}")
        return self

    def loss_options(self) -> LossOptions:
        """The knobs particular losses read (SAPO's temperatures, VESPO's kernel)."""
        from gspo_cli.algorithms import LossOptions

        return LossOptions(
            sapo_tau_pos=self.sapo_tau_pos, sapo_tau_neg=self.sapo_tau_neg,
            vespo_k_pos=self.vespo_k_pos, vespo_lambda_pos=self.vespo_lambda_pos,
            vespo_k_neg=self.vespo_k_neg, vespo_lambda_neg=self.vespo_lambda_neg,
        )  # fmt: skip

    @model_validator(mode="after")
    def _kl_settings_need_kl(self) -> AlgorithmConfig:
        # A KL setting without a KL would be silently ignored: say so instead.
        unused = [
            f"{key} {value}"
            for key, value, default in (
                ("kl_estimator", self.kl_estimator, "k3"),
                ("kl_in", self.kl_in, "loss"),
                ("ref_update_every", self.ref_update_every, 0),
            )
            if value != default
        ]
        if self.kl_coef == 0 and unused:
            raise ValueError(f"algorithm.{unused[0]} has no effect with kl_coef 0: set kl_coef > 0")
        return self
