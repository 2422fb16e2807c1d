"""A token server over a torch model, shaped like SGLang: one request = one sequential sampled continuation.

``TorchTokenGenerator`` answers a request the way SGLang 0.5.12's scheduler does (facts read from its
source, ``sglang/srt``): the prompt is read causally at positions ``0..L-1`` (no parallel mask), sampling
applies the repetition penalty to the request's output tokens, then temperature, top-k and top-p; a
request stops after ``max_new_tokens`` (checked first, so a stop token drawn last reports ``length``) or
after a token of ``stop_token_ids`` or of the model's eos ids (``managers/schedule_batch.py:
Req.check_finished``). The log-probability returned for a sampled token is ``log(softmax(logits / T))``
of the penalised logits (``layers/sampler.py``), or ``log_softmax`` of them before temperature when
``return_original_logprob`` (SGLang's ``SGLANG_RETURN_ORIGINAL_LOGPROB=1``); prompt-token log-probs are
plain ``log_softmax`` (``layers/utils/logprob.py``). Sampling is seeded per request and position by
``sampling_seed`` only in deterministic mode (``--enable-deterministic-inference``); otherwise one
server-wide generator seeded by ``random_seed`` draws.

It is two things: the model behind the protocol-faithful stand-in SGLang server of the tests
(``tests/support/sglang_standin.py``), and an in-process ``async generate(prompt_ids, sampling_params)``
(``as_async``) with verl's ``server_manager.generate`` result shape, so the async driver and verl's agent
loop run on CPU without a server.
"""

from __future__ import annotations

import asyncio
import math
import threading
from dataclasses import dataclass, field
from typing import Any

import torch

from components.engine.kv_cache import growing_cache
from components.engine.sampling import apply_repetition_penalty, filter_logits


@dataclass
class TokenAnswer:
    """One request's answer, with the fields verl's ``TokenOutput`` and SGLang's ``meta_info`` carry.

    ``input_logprobs[i]`` is the log-prob of prompt token ``logprob_start + i`` (None for the first, as
    SGLang: nothing predicts it within the request).
    """

    token_ids: list[int]
    log_probs: list[float]
    stop_reason: str  # "stop" | "length"
    matched: int | None = None
    input_logprobs: list[float | None] = field(default_factory=list)
    extra_fields: dict[str, Any] = field(default_factory=dict)


def _seeded_generator(seed: int, position: int, device: torch.device) -> torch.Generator:
    return torch.Generator(device=device).manual_seed((seed * 1_000_003 + position) % (2**63 - 1))


class TorchTokenGenerator:
    """Sequential sampling over a Hugging Face causal LM, with SGLang's request semantics."""

    def __init__(
        self,
        model: Any,
        eos_ids: list[int],
        random_seed: int = 0,
        deterministic: bool = False,
        return_original_logprob: bool = False,
    ) -> None:
        self.model = model
        self.eos_ids = list(eos_ids)
        self.deterministic = deterministic
        self.return_original_logprob = return_original_logprob
        self.device = next(model.parameters()).device
        self.generator = torch.Generator(device=self.device).manual_seed(random_seed)
        self._lock = threading.Lock()  # one request at a time on the model

    @torch.no_grad()
    def generate(
        self, prompt_ids: list[int], sampling_params: dict[str, Any], logprob_start_len: int = -1
    ) -> TokenAnswer:
        """Answer one request (SGLang ``sampling_params`` names; unknown keys are ignored as SGLang's
        defaults would leave them)."""
        sp = sampling_params
        max_new = int(sp.get("max_new_tokens", 128) if sp.get("max_new_tokens") is not None else 128)
        temperature = float(sp.get("temperature", 1.0) if sp.get("temperature") is not None else 1.0)
        top_p = float(sp.get("top_p", 1.0) if sp.get("top_p") is not None else 1.0)
        top_k = int(sp.get("top_k", -1) if sp.get("top_k") is not None else -1)
        penalty = float(sp.get("repetition_penalty", 1.0) or 1.0)
        stops = {int(t) for t in (sp.get("stop_token_ids") or [])}
        if not sp.get("ignore_eos", False):
            stops |= set(self.eos_ids)
        seed = sp.get("sampling_seed")
        greedy = temperature < 1e-6
        if not prompt_ids:
            raise ValueError("the request has no input tokens")
        with self._lock:
            cache = growing_cache(self.model, len(prompt_ids) + min(max_new, 64) + 1)
            ids = torch.tensor([prompt_ids], dtype=torch.long, device=self.device)
            out = self.model(input_ids=ids, past_key_values=cache, use_cache=True)
            input_lps: list[float | None] = []
            if logprob_start_len >= 0:
                logp = torch.log_softmax(out.logits[0].float(), dim=-1)
                targets = ids[0, logprob_start_len + 1 :]
                values = (
                    logp[logprob_start_len : len(prompt_ids) - 1].gather(-1, targets[:, None]).squeeze(-1)
                )
                input_lps = [None, *values.tolist()]
            logits = out.logits[0, -1:].float()
            tokens: list[int] = []
            lps: list[float] = []
            reason, matched = "length", None
            position = len(prompt_ids)
            while len(tokens) < max_new:
                scores = logits
                if penalty != 1.0 and tokens:
                    scores = apply_repetition_penalty(scores, [tokens], [penalty])
                if greedy:
                    tok = int(scores.argmax(-1))
                    lp = float(torch.log_softmax(scores, -1)[0, tok])
                else:
                    probs = torch.softmax(filter_logits(scores, temperature, top_k, top_p), dim=-1)
                    gen = _seeded_generator(int(seed if seed is not None else 42), position, self.device)
                    tok = int(
                        torch.multinomial(probs, 1, generator=gen if self.deterministic else self.generator)
                    )
                    if self.return_original_logprob:
                        lp = float(torch.log_softmax(scores, -1)[0, tok])
                    else:
                        lp = float(torch.log_softmax(scores / temperature, -1)[0, tok])
                tokens.append(tok)
                lps.append(lp)
                if len(tokens) >= max_new:  # SGLang checks the length first
                    break
                if tok in stops:
                    reason, matched = "stop", tok
                    break
                step = self.model(
                    input_ids=torch.tensor([[tok]], device=self.device),
                    position_ids=torch.tensor([[position]], device=self.device),
                    past_key_values=cache,
                    use_cache=True,
                )
                logits = step.logits[0, -1:].float()
                position += 1
        if not math.isfinite(sum(lps)) and lps:
            raise RuntimeError("non-finite log-probabilities from the model")
        return TokenAnswer(tokens, lps, reason, matched, input_lps)

    def as_async(self) -> AsyncTorchTokens:
        """An ``async generate(prompt_ids, sampling_params[, tail])`` over this generator."""
        return AsyncTorchTokens(self)


class AsyncTorchTokens:
    """``await gen(prompt_ids, sampling_params)`` -> ``TokenAnswer`` (verl ``TokenOutput`` field names).

    With ``scores_prompt_tail`` it also returns the log-probs of the last ``tail`` prompt tokens (the
    forced ones) in ``extra_fields["prompt_tail_logprobs"]``. Requests run in a worker thread so several
    can be awaited at once (they are served one at a time, like one replica).
    """

    scores_prompt_tail = True

    def __init__(self, inner: TorchTokenGenerator) -> None:
        self.inner = inner
        self.requests: list[tuple[list[int], dict[str, Any]]] = []

    async def __call__(
        self, prompt_ids: list[int], sampling_params: dict[str, Any], tail: int = 0
    ) -> TokenAnswer:
        self.requests.append((list(prompt_ids), dict(sampling_params)))
        start = len(prompt_ids) - tail - 1 if tail else -1
        answer = await asyncio.to_thread(self.inner.generate, list(prompt_ids), dict(sampling_params), start)
        if tail:
            answer.extra_fields["prompt_tail_logprobs"] = answer.input_logprobs[1:]
        return answer
