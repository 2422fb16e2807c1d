"""Choosing the next token from logits: repetition penalty, temperature, top-k, top-p, seeded sampling.

The log-probability the engine RECORDS is always that of the model's raw distribution
(``log_softmax(logits)``), not of the tempered/truncated sampling distribution: it is what a trainer
recomputes teacher-forced, so engine and trainer can be compared number for number.
"""

from __future__ import annotations

import torch


def raw_logprobs(logits: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """Log-probability of ``token_ids`` under the model's own distribution.

    Args:
        logits: ``(n, vocab)`` float logits.
        token_ids: ``(n,)`` long.

    Returns:
        ``(n,)`` float32 ``log_softmax(logits)[i, token_ids[i]]``.
    """
    logp = torch.log_softmax(logits.float(), dim=-1)
    return logp.gather(-1, token_ids[:, None]).squeeze(-1)


def apply_repetition_penalty(
    logits: torch.Tensor, history: list[list[int]], penalties: list[float]
) -> torch.Tensor:
    """CTRL-style penalty: a logit of an already-seen token is divided by p if positive, multiplied if not.

    Args:
        logits: ``(n, vocab)``; a penalised copy is returned.
        history: per row, the token ids the penalty looks back on (inside a step: that step's tokens).
        penalties: per row, the factor (1.0 = none).
    """
    out = logits.clone()
    for row, (seen, p) in enumerate(zip(history, penalties, strict=True)):
        if p == 1.0 or not seen:
            continue
        idx = torch.tensor(sorted(set(seen)), dtype=torch.long, device=logits.device)
        vals = out[row, idx]
        out[row, idx] = torch.where(vals > 0, vals / p, vals * p)
    return out


def filter_logits(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """Tempered logits with everything outside top-k / the top-p nucleus set to -inf.

    Args:
        logits: ``(n, vocab)``; ``temperature`` > 0 (greedy is handled by the caller).

    Returns:
        ``(n, vocab)`` float32.
    """
    scores = logits.float() / temperature
    if 0 < top_k < scores.shape[-1]:
        kth = torch.topk(scores, top_k, dim=-1).values[:, -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if top_p < 1.0:
        sorted_scores, order = torch.sort(scores, descending=True, dim=-1)
        probs = torch.softmax(sorted_scores, dim=-1)
        # Drop a token when the mass strictly before it already reaches top_p (the top token always stays).
        drop_sorted = (probs.cumsum(-1) - probs) >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        scores = scores.masked_fill(drop, float("-inf"))
    return scores


def choose_tokens(
    logits: torch.Tensor,
    temperature: float,
    top_k: int,
    top_p: float,
    generator: torch.Generator,
    banned: torch.Tensor | None = None,
) -> torch.Tensor:
    """Pick one token per row: argmax when ``temperature == 0``, else a seeded multinomial draw.

    Args:
        logits: ``(n, vocab)`` (already repetition-penalised where wanted).
        banned: optional ``(n, vocab)`` bool; True = this row may not pick that token (e.g. end-of-turn
            inside a step). A row never has every token banned.

    Returns:
        ``(n,)`` long.
    """
    if banned is not None:
        logits = logits.masked_fill(banned, float("-inf"))
    if temperature == 0:
        return logits.argmax(-1)
    probs = torch.softmax(filter_logits(logits, temperature, top_k, top_p), dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)
