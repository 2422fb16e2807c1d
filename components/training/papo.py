"""PAPO (Parallel-Aware Policy Optimization, NPR Stage 3) as verl plugins.

Importing this module registers, through verl's own registries:

- the policy loss ``papo`` (``get_policy_loss_fn("papo")``): strict on-policy REINFORCE written as a ratio,
  ``ratio = exp(logπ - sg(logπ))``. Its value is exactly 1 and its gradient is ``∇logπ``, so the loss is
  ``-token_mean(A · logπ)`` in gradient. There is no clipping and no clip-masking: the special tag tokens
  (``<step>``, ``</guideline>``, ...) are often the low-probability tokens a clipped objective would mask
  out, and PAPO must keep training them.
- the advantage estimator ``papo`` (``get_adv_estimator_fn("papo")``): group-mean baseline divided by the
  standard deviation of the whole batch's rewards, computed once. The public NPR code recomputes that std
  inside its loop over a partly normalised vector (npr-reference.md §1.7); this is the clean form.

On verl GPU runs the module is imported in every Ray worker through ``VERL_USE_EXTERNAL_MODULES`` and
``actor_rollout_ref.model.external_lib`` (see ``components.training.verl_launch``). The local trainer
(``components.training.rl``) calls the same registered functions.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np
import torch
from verl.trainer.ppo.core_algos import (
    ADV_ESTIMATOR_REGISTRY,
    POLICY_LOSS_REGISTRY,
    agg_loss,
    register_adv_est,
    register_policy_loss,
)
from verl.utils import torch_functional as verl_F

PAPO_NAME = "papo"


def compute_papo_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    config: Any | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PAPO outcome advantage: ``A_i = (r_i - mean_{g(i)} r) / (std_batch(r) + eps)``, broadcast over tokens.

    Args:
        token_level_rewards: ``(bs, response_length)``; the sequence reward is the row sum (verl places the
            outcome reward on the last valid token).
        response_mask: ``(bs, response_length)``, 1 on response tokens.
        index: ``(bs,)`` group id (prompt uid) of each response.
        epsilon: added to the batch std to avoid division by zero.
        config: verl ``AlgoConfig`` (unused; accepted for the registry's calling convention).

    Returns:
        ``(advantages, returns)``, both ``(bs, response_length)`` and equal (outcome supervision).

    Groups of one response get a zero baseline, as verl's GRPO does (structural filtering can leave one
    survivor of a group). The std is the unbiased std of the ``bs`` sequence rewards, computed once.
    """
    scores = token_level_rewards.sum(dim=-1)
    bsz = scores.shape[0]
    if len(index) != bsz:
        raise ValueError(f"index has {len(index)} entries for a batch of {bsz} responses")
    with torch.no_grad():
        members: dict[Any, list[int]] = defaultdict(list)
        for i in range(bsz):
            members[index[i]].append(i)
        baseline = torch.zeros_like(scores)
        for rows in members.values():
            if len(rows) > 1:
                baseline[rows] = scores[rows].mean()
        batch_std = scores.std() if bsz > 1 else torch.ones((), dtype=scores.dtype)
        if not batch_std > 0:
            # every reward equal: a group survivor of the structural filter kept its zero baseline, and
            # dividing by epsilon would turn its reward into a 1e6 advantage; scale 1, as for one response
            batch_std = torch.ones((), dtype=scores.dtype)
        advantages = ((scores - baseline) / (batch_std + epsilon)).unsqueeze(-1) * response_mask
    return advantages, advantages


def compute_policy_loss_papo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any | None = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """PAPO policy loss: ``agg(-A · exp(logπ - sg(logπ)))``; value ``agg(-A)``, gradient ``-agg(A · ∇logπ)``.

    Args:
        old_log_prob: ``(bs, response_length)``; not used by the objective (strict on-policy: there is no
            old-policy pass), only to report ``actor/ppo_kl`` when the caller supplies one.
        log_prob: ``(bs, response_length)`` log-probabilities under the current policy (with grad).
        advantages: ``(bs, response_length)``.
        response_mask: ``(bs, response_length)``.
        loss_agg_mode: verl aggregation mode; PAPO uses ``token-mean``.
        config: verl ``ActorConfig``; its ``global_batch_info`` is forwarded to ``agg_loss``.
        rollout_is_weights: optional ``(bs, response_length)`` importance weights (verl rollout correction).

    Returns:
        ``(loss, metrics)`` with the keys verl's vanilla loss reports (clip fractions are 0 by construction).
    """
    ratio = torch.exp(log_prob - log_prob.detach())
    pg_losses = -advantages * ratio
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights
    batch_info = dict(getattr(config, "global_batch_info", None) or {}) if config is not None else {}
    loss = agg_loss(loss_mat=pg_losses, loss_mask=response_mask, loss_agg_mode=loss_agg_mode, **batch_info)
    with torch.no_grad():
        ppo_kl = verl_F.masked_mean(old_log_prob - log_prob, response_mask)
    metrics = {"actor/pg_clipfrac": 0.0, "actor/ppo_kl": ppo_kl.item(), "actor/pg_clipfrac_lower": 0.0}
    return loss, metrics


def _register() -> None:
    # register_adv_est raises if the name holds a different function (e.g. after importlib.reload), and
    # register_policy_loss silently overwrites: check both so a clash with another plugin is loud.
    existing_loss = POLICY_LOSS_REGISTRY.get(PAPO_NAME)
    if existing_loss is not None and existing_loss.__qualname__ != compute_policy_loss_papo.__qualname__:
        raise RuntimeError(
            f"verl policy loss {PAPO_NAME!r} is already registered by {existing_loss.__module__}"
        )
    register_policy_loss(PAPO_NAME)(compute_policy_loss_papo)
    existing_adv = ADV_ESTIMATOR_REGISTRY.get(PAPO_NAME)
    if existing_adv is not None and existing_adv.__qualname__ == compute_papo_advantage.__qualname__:
        ADV_ESTIMATOR_REGISTRY[PAPO_NAME] = compute_papo_advantage  # same plugin re-imported
    else:
        register_adv_est(PAPO_NAME)(compute_papo_advantage)


_register()
