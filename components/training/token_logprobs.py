"""Log-probabilities of chosen tokens without a batch's full-vocabulary logits: the one scorer of both trainers.

A causal LM's forward returns ``(B, L, V)`` logits; the trainers need one number per scored token. For
Qwen3-4B (V = 151,936) one 32k-token sequence's logits are 10 GB in bf16 and 20 GB once upcast to fp32,
more than the model. So the decoder runs alone (``model.get_decoder()``: hidden states ``(B, L, H)``), the
hidden state each scored token is predicted from is gathered (``source_index``: the previous position in
causal layouts, the parent position in parallel ones), and the output projection, the fp32 upcast and the
log-softmax run over ``chunk_tokens`` tokens at a time, each chunk under activation checkpointing. So at
most one chunk's ``(C, V)`` logits are alive, in the forward and in the backward (which recomputes them),
as verl does with its chunked/fused log-prob kernels. The numbers are those of the full log-softmax
(tests/unit/training/test_token_logprobs.py).

Under FSDP (``components.training.distributed.shard_model``) this runs as a registered FSDP forward method
of the root module, so its parameters (embeddings, final norm, tied head) are gathered around it.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

# Tokens per vocabulary projection: the fp32 logits of a chunk are chunk_tokens * V * 4 bytes (Qwen3's vocab:
# 0.6 GB), and three such buffers live at once (upcast, exp, grad); components.training.memory counts it.
DEFAULT_CHUNK_TOKENS = 1024
FSDP_METHOD = "npr_token_log_probs"


def token_log_probs(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor | None,
    source_index: torch.Tensor,
    targets: torch.Tensor,
    mask: torch.Tensor,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``log p(targets[b, j] | position source_index[b, j])`` for every ``mask``-ed entry.

    Args:
        model: a Hugging Face causal LM (``get_decoder()`` and ``get_output_embeddings()``), possibly FSDP.
        input_ids: ``(B, L)``; attention_mask: ``(B, L)`` or ``(B, 1, L, L)`` as the model takes it;
            position_ids: ``(B, L)`` or None.
        source_index: ``(B, R)`` long, positions in ``[0, L)`` whose hidden state predicts each entry.
        targets: ``(B, R)`` token ids to score; mask: ``(B, R)`` (non-zero = scored).
        temperature: logits are divided by it (verl's actor does the same with the rollout temperature).
        with_entropy: also return the per-entry entropy of the predictive distribution (no gradient).
        chunk_tokens: scored tokens per vocabulary projection.

    Returns:
        ``log_prob`` ``(B, R)`` float32 (0 where not scored; carries the gradient), and ``entropy`` or None.
    """
    method = getattr(model, FSDP_METHOD, None)
    fn = method if method is not None else lambda *a, **k: _token_log_probs(model, *a, **k)
    return fn(
        input_ids,
        attention_mask,
        position_ids,
        source_index,
        targets,
        mask,
        temperature=temperature,
        with_entropy=with_entropy,
        chunk_tokens=chunk_tokens,
    )


def output_head(model: Any) -> torch.nn.Module:
    """The vocabulary projection; refuses heads this scorer would compute differently from the model."""
    config = getattr(model, "config", None)
    if getattr(config, "final_logit_softcapping", None):
        raise ValueError(f"{type(model).__name__} soft-caps its logits; the chunked scorer does not")
    head = model.get_output_embeddings()
    if not isinstance(head, torch.nn.Linear):
        raise ValueError(f"{type(model).__name__}'s output head is {type(head).__name__}, not a Linear")
    return head


def _token_log_probs(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor | None,
    source_index: torch.Tensor,
    targets: torch.Tensor,
    mask: torch.Tensor,
    *,
    temperature: float,
    with_entropy: bool,
    chunk_tokens: int,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    head = output_head(model)
    hidden = model.get_decoder()(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
    ).last_hidden_state
    width = hidden.shape[-1]
    scored = mask.bool()
    # (T, H): the hidden state of each scored token's source position, T = number of scored tokens
    sources = hidden.gather(1, source_index.unsqueeze(-1).expand(-1, -1, width))[scored]
    wanted = targets[scored]
    logp_parts, entropy_parts = [], []
    for start in range(0, sources.shape[0], chunk_tokens):
        args = (
            sources[start : start + chunk_tokens],
            head.weight,
            head.bias,
            wanted[start : start + chunk_tokens],
        )
        if torch.is_grad_enabled():
            logp, entropy = checkpoint(
                _chunk, *args, temperature, with_entropy, use_reentrant=False, preserve_rng_state=False
            )
        else:
            logp, entropy = _chunk(*args, temperature, with_entropy)
        logp_parts.append(logp)
        entropy_parts.append(entropy)
    zeros = torch.zeros(mask.shape, dtype=torch.float32, device=hidden.device)
    flat = torch.cat(logp_parts) if logp_parts else zeros.new_zeros(0)
    log_prob = zeros.masked_scatter(scored, flat)
    entropy_out = None
    if with_entropy:
        flat_entropy = torch.cat(entropy_parts) if entropy_parts else zeros.new_zeros(0)
        entropy_out = zeros.detach().masked_scatter(scored, flat_entropy)
    return log_prob, entropy_out


def _chunk(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    temperature: float,
    with_entropy: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(C,)`` log-probs of ``targets`` (and entropies) from ``(C, H)`` hidden states."""
    logits = F.linear(hidden, weight, bias).float()
    if temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    log_norm = torch.logsumexp(logits, dim=-1)
    logp = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - log_norm
    entropy = None
    if with_entropy:
        with torch.no_grad():
            entropy = log_norm - (torch.softmax(logits, dim=-1) * logits).sum(-1)
    return logp, entropy


def register_fsdp_method(model: Any) -> None:
    """Make ``token_log_probs`` run inside the root FSDP module's forward hooks (called by shard_model)."""
    from torch.distributed.fsdp import register_fsdp_forward_method  # lazy: fsdp

    def method(self: Any, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
        return _token_log_probs(self, *args, **kwargs)

    setattr(model, FSDP_METHOD, method.__get__(model, type(model)))
    register_fsdp_forward_method(model, FSDP_METHOD)
