"""The RL objective of the local trainer, by calling verl's registered functions (never copies of them).

``algorithm`` in the stage config names a pair (advantage estimator, policy loss) in verl's registries:
``dapo`` and ``grpo`` -> (``grpo``, ``vanilla``) (they differ in dynamic sampling only) and ``papo`` -> (``papo``, ``papo``, registered by
``components.training.papo``). The same names go into the verl launch overrides.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from verl.trainer.ppo.core_algos import get_adv_estimator_fn, get_policy_loss_fn
from verl.workers.config import ActorConfig
from verl.workers.config.actor import PolicyLossConfig

import components.training.papo as papo  # noqa: F401  (registers the `papo` loss and estimator)
from components.training.config import RLStageConfig
from components.training.verl.plugin_names import DAPO_ADV_ESTIMATOR, verl_names


def actor_config(stage_cfg: RLStageConfig) -> ActorConfig:
    """The verl ``ActorConfig`` the policy loss reads (clip ratios, aggregation, loss mode).

    ``strategy``/micro-batch fields are required by verl's dataclass but unused by the loss functions.
    """
    _, loss_mode = verl_names(stage_cfg.algorithm)
    return ActorConfig(
        strategy="fsdp",
        rollout_n=stage_cfg.group_size,
        ppo_micro_batch_size_per_gpu=1,
        clip_ratio_low=stage_cfg.clip_ratio_low,
        clip_ratio_high=stage_cfg.clip_ratio_high,
        clip_ratio_c=stage_cfg.clip_ratio_c,
        loss_agg_mode=stage_cfg.loss_agg_mode,
        policy_loss=PolicyLossConfig(loss_mode=loss_mode),
    )


def outcome_token_rewards(rewards: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """``(bs, R)`` token-level rewards with each sequence reward on its last response token (verl layout).

    Args:
        rewards: ``(bs,)`` sequence rewards.
        response_mask: ``(bs, R)``; every row must hold at least one response token.
    """
    lengths = response_mask.sum(dim=-1).long()
    if bool((lengths == 0).any()):
        raise ValueError("a response with no tokens cannot carry an outcome reward")
    token_rewards = torch.zeros(response_mask.shape, dtype=torch.float32)
    token_rewards[torch.arange(len(rewards)), lengths - 1] = rewards.to(torch.float32)
    return token_rewards


def compute_advantages(
    algorithm: str,
    rewards: torch.Tensor,
    response_mask: torch.Tensor,
    group_ids: list[str],
    norm_adv_by_std: bool = True,
) -> torch.Tensor:
    """``(bs, R)`` advantages from verl's registered estimator for ``algorithm``.

    Args:
        rewards: ``(bs,)`` sequence rewards.
        response_mask: ``(bs, R)`` float or bool mask of response tokens.
        group_ids: ``bs`` prompt uids (responses to one prompt share one).
        norm_adv_by_std: verl's ``norm_adv_by_std_in_grpo`` (GRPO/DAPO only; PAPO always normalises by
            the batch std, which is its definition).
    """
    estimator, _ = verl_names(algorithm)
    mask = response_mask.to(torch.float32)
    kwargs: dict[str, Any] = {}
    if estimator == DAPO_ADV_ESTIMATOR:
        kwargs["norm_adv_by_std_in_grpo"] = norm_adv_by_std
    elif not norm_adv_by_std:
        raise ValueError(
            f"norm_adv_by_std=False is a GRPO/DAPO option; {algorithm!r} defines its own scaling"
        )
    advantages, _ = get_adv_estimator_fn(estimator)(
        token_level_rewards=outcome_token_rewards(rewards, mask),
        response_mask=mask,
        index=np.array(group_ids, dtype=object),
        **kwargs,
    )
    return advantages


def compute_policy_loss(
    algorithm: str,
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    config: ActorConfig,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """Scalar loss and verl's loss metrics, from verl's registered policy loss for ``algorithm``.

    All tensors are ``(bs, R)``; ``log_prob`` carries the gradient. ``rollout_is_weights`` are verl's
    per-token importance weights (PAPO's post-merge correction, ``papo.post_merge_is_weights``).
    """
    _, loss_mode = verl_names(algorithm)
    return get_policy_loss_fn(loss_mode)(
        old_log_prob,
        log_prob,
        advantages,
        response_mask.to(log_prob.dtype),
        config.loss_agg_mode,
        config,
        rollout_is_weights,
    )
