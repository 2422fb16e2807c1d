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

The re-prefill correction (``post_merge_is_weights``, on the tokens ``components.structure.post_merge_mask``
marks). A backend that cannot merge branches into one KV cache (a stock SGLang server, verl's
``server_manager``) continues after a block by re-prefilling ``prefix + branch_1 + ... + branch_k``: later
branches then see earlier ones at sequential positions, so every token from the first merge of a multi-branch
block on was sampled from a context the trainer (canonical mask and positions) does not reproduce. Those
tokens get verl's token-level truncated importance weight ``min(exp(sg(logπ) - logπ_rollout), C)`` (TIS,
``rollout_is_threshold`` = C) as ``rollout_is_weights`` of the loss; tokens before that merge (the plans and
the first block's branches) were sampled exactly and keep weight 1. Their log-prob mismatch is reported
separately (it should be ~0).

On verl GPU runs the module is imported in every Ray worker through ``VERL_USE_EXTERNAL_MODULES`` and
``actor_rollout_ref.model.external_lib`` (see ``components.training.verl.job``). The local trainer
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

from components.training.verl.plugin_names import PAPO_NAME


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
    survivor of a group). The std is the unbiased std of the sequence rewards of the batch's responses,
    computed once. Rows without a response token are left out of every statistic and get advantage 0:
    verl pads a batch to a multiple of its data-parallel size with synthetic rows whose reward is 0 and
    whose response mask is empty (``verl/trainer/ppo/padding_utils.py``), and counting their zeros would
    shrink or inflate every advantage depending on how many pads the batch needed.
    """
    scores = token_level_rewards.sum(dim=-1)
    bsz = scores.shape[0]
    if len(index) != bsz:
        raise ValueError(f"index has {len(index)} entries for a batch of {bsz} responses")
    with torch.no_grad():
        real = response_mask.sum(dim=-1) > 0
        members: dict[Any, list[int]] = defaultdict(list)
        for i in range(bsz):
            if bool(real[i]):
                members[index[i]].append(i)
        baseline = torch.zeros_like(scores)
        for rows in members.values():
            if len(rows) > 1:
                baseline[rows] = scores[rows].mean()
        counted = scores[real]
        batch_std = counted.std() if counted.numel() > 1 else torch.ones((), dtype=scores.dtype)
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
            old-policy pass), only to report ``actor/ppo_kl`` over its finite entries.
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
        # old log-probs are the rollout's in verl's bypass mode: NaN for tokens a server forced into a
        # prompt and could not score (components.engine.async_driver); they carry no KL information
        known = torch.isfinite(old_log_prob)
        diff = torch.where(known, old_log_prob - log_prob, torch.zeros_like(log_prob))
        ppo_kl = verl_F.masked_mean(diff, response_mask * known)
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


def post_merge_is_weights(
    log_prob: torch.Tensor,
    rollout_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    post_merge: torch.Tensor,
    threshold: float,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Truncated importance weights on post-merge tokens, and the rollout/trainer mismatch per token class.

    Args:
        log_prob: ``(bs, R)`` trainer log-probs (the canonical parallel forward; detached here).
        rollout_log_prob: ``(bs, R)`` log-probs the rollout engine sampled the tokens with.
        response_mask: ``(bs, R)`` 1 on response tokens.
        post_merge: ``(bs, R)`` bool, True on tokens sampled after a re-prefilled merge
            (``components.structure.post_merge_mask``).
        threshold: C, the truncation of the weight (verl's ``rollout_is_threshold``; >= 1).

    Returns:
        ``weights`` ``(bs, R)``: ``min(exp(log_prob - rollout_log_prob), C)`` on post-merge response tokens,
        1 elsewhere (a non-finite rollout log-prob also gets 1 and is counted); and metrics: the mean and
        max |Δlogp| of pre-merge tokens (exact by construction, ~0) and of post-merge tokens (mean and p99),
        the mean weight, the fraction truncated at C, and the share of post-merge tokens.
    """
    if threshold < 1.0:
        raise ValueError(f"the truncation threshold C must be >= 1, got {threshold}")
    with torch.no_grad():
        lp = log_prob.detach().float()
        rollout = rollout_log_prob.detach().float().to(lp.device)
        valid = response_mask.to(lp.device).bool()
        merged = post_merge.to(lp.device).bool() & valid
        finite = torch.isfinite(rollout)
        delta = torch.where(finite, lp - rollout, torch.zeros_like(lp))
        raw = torch.exp(delta.clamp(max=20.0))
        weights = torch.where(merged & finite, raw.clamp(max=threshold), torch.ones_like(lp))
        pre = valid & ~merged & finite
        post = merged & finite
        abs_delta = delta.abs()
        metrics: dict[str, float] = {
            "rollout_corr/pre_merge_abs_logp_diff_mean": _masked_mean(abs_delta, pre),
            "rollout_corr/pre_merge_abs_logp_diff_max": _masked_max(abs_delta, pre),
            "rollout_corr/post_merge_abs_logp_diff_mean": _masked_mean(abs_delta, post),
            "rollout_corr/post_merge_abs_logp_diff_p99": _masked_quantile(abs_delta, post, 0.99),
            "rollout_corr/post_merge_is_weight_mean": _masked_mean(weights, post),
            "rollout_corr/post_merge_is_truncated_frac": _masked_mean((raw > threshold).float(), post),
            "rollout_corr/post_merge_token_frac": float(merged.sum()) / max(1, int(valid.sum())),
            "rollout_corr/nonfinite_rollout_logp": float((valid & ~finite).sum()),
        }
    return weights, metrics


def _masked_mean(values: torch.Tensor, mask: torch.Tensor) -> float:
    n = int(mask.sum())
    return float(values[mask].sum()) / n if n else 0.0


def _masked_max(values: torch.Tensor, mask: torch.Tensor) -> float:
    return float(values[mask].max()) if bool(mask.any()) else 0.0


def _masked_quantile(values: torch.Tensor, mask: torch.Tensor, q: float) -> float:
    # kthvalue, not torch.quantile: quantile refuses inputs of more than 2**24 elements
    picked = values[mask]
    if picked.numel() == 0:
        return 0.0
    k = min(picked.numel(), max(1, int(np.ceil(q * picked.numel()))))
    return float(picked.kthvalue(k).values)


_register()
