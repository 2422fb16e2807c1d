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


@dataclass(frozen=True)
class _Request:
    """One request's settings, read from its SGLang ``sampling_params``."""

    prompt_ids: list[int]
    max_new: int
    temperature: float
    top_p: float
    top_k: int
    penalty: float
    stops: frozenset[int]
    seed: int | None

    @property
    def sampler(self) -> tuple[float, int, float]:
        """The settings rows must share to be filtered and sampled together."""
        return (self.temperature, self.top_k, self.top_p)


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
        seed_requests: bool = False,
    ) -> None:
        self.model = model
        self.eos_ids = list(eos_ids)
        self.deterministic = deterministic
        # A request that carries a sampling_seed is drawn from it even outside deterministic mode (verl's
        # torch rollout: the npr_parallel agent loop seeds every extension; SGLang would ignore the seed).
        self.seed_requests = seed_requests
        self.return_original_logprob = return_original_logprob
        self.device = next(model.parameters()).device
        self.generator = torch.Generator(device=self.device).manual_seed(random_seed)
        self._lock = threading.Lock()  # one request at a time on the model

    def _request(self, prompt_ids: list[int], sampling_params: dict[str, Any]) -> _Request:
        """A request's settings from SGLang ``sampling_params`` names (unknown keys are ignored, as SGLang's
        defaults would leave them)."""
        sp = sampling_params

        def value(key: str, default: Any) -> Any:
            return sp.get(key) if sp.get(key) is not None else default

        stops = {int(t) for t in (sp.get("stop_token_ids") or [])}
        if not sp.get("ignore_eos", False):
            stops |= set(self.eos_ids)
        if not prompt_ids:
            raise ValueError("the request has no input tokens")
        return _Request(
            prompt_ids=[int(t) for t in prompt_ids],
            max_new=int(value("max_new_tokens", 128)),
            temperature=float(value("temperature", 1.0)),
            top_p=float(value("top_p", 1.0)),
            top_k=int(value("top_k", -1)),
            penalty=float(sp.get("repetition_penalty", 1.0) or 1.0),
            stops=frozenset(stops),
            seed=sp.get("sampling_seed"),
        )

    @torch.no_grad()
    def generate(
        self, prompt_ids: list[int], sampling_params: dict[str, Any], logprob_start_len: int = -1
    ) -> TokenAnswer:
        """Answer one request (SGLang ``sampling_params`` names; unknown keys are ignored as SGLang's
        defaults would leave them)."""
        req = self._request(prompt_ids, sampling_params)
        max_new, temperature, top_p, top_k = req.max_new, req.temperature, req.top_p, req.top_k
        penalty, stops, seed = req.penalty, req.stops, req.seed
        greedy = temperature < 1e-6
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
                    seeded = self.deterministic or (self.seed_requests and seed is not None)
                    tok = int(torch.multinomial(probs, 1, generator=gen if seeded else self.generator))
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

    @torch.no_grad()
    def generate_many(self, requests: list[tuple[list[int], dict[str, Any]]]) -> list[TokenAnswer]:
        """Answer several requests as one batch: the answers ``generate`` gives one by one.

        The prompts are left-padded into one prefill (each row attends to its own tokens only, at its own
        positions ``0..L-1``; a padding slot sees only itself, so no row of the mask is empty), then every
        unfinished row decodes one token per step and a row leaves the batch (and its cache rows) when it
        finishes. Rows are filtered and sampled in groups of equal settings. In deterministic mode (and
        with ``seed_requests``, for requests that carry one) every draw is seeded by the request's
        ``sampling_seed`` and position, so each answer is token for token the one ``generate`` gives;
        otherwise draws come from the server-wide generator, as SGLang's.
        """
        reqs = [self._request(prompt, params) for prompt, params in requests]
        if not reqs:
            return []
        batch = len(reqs)
        lengths = [len(r.prompt_ids) for r in reqs]
        width = max(lengths)
        pad = self.eos_ids[0] if self.eos_ids else 0
        ids = torch.full((batch, width), pad, dtype=torch.long)
        real = torch.zeros((batch, width), dtype=torch.bool)
        positions = torch.zeros((batch, width), dtype=torch.long)
        for b, (req, n) in enumerate(zip(reqs, lengths, strict=True)):
            ids[b, width - n :] = torch.tensor(req.prompt_ids)
            real[b, width - n :] = True
            positions[b, width - n :] = torch.arange(n)
        q = torch.arange(width)
        causal = q[:, None] >= q[None, :]
        allowed = causal[None] & (real[:, None, :] | torch.eye(width, dtype=torch.bool)[None])
        tokens: list[list[int]] = [[] for _ in reqs]
        lps: list[list[float]] = [[] for _ in reqs]
        reasons = ["length"] * batch
        matched: list[int | None] = [None] * batch
        with self._lock:
            longest = max(r.max_new for r in reqs)
            cache = growing_cache(self.model, width + min(longest, 64) + 1)
            out = self.model(
                input_ids=ids.to(self.device),
                attention_mask=self._mask(allowed[:, None]),
                position_ids=positions.to(self.device),
                past_key_values=cache,
                use_cache=True,
                logits_to_keep=1,
            )
            logits = out.logits[:, -1].float()
            active = list(range(batch))  # cache row -> request
            key_real = real
            while active:
                chosen, chosen_lps = self._choose(
                    logits,
                    [reqs[i] for i in active],
                    [tokens[i] for i in active],
                    [lengths[i] + len(tokens[i]) for i in active],
                )
                still = []
                for row, i in enumerate(active):
                    tok = chosen[row]
                    tokens[i].append(tok)
                    lps[i].append(chosen_lps[row])
                    if len(tokens[i]) >= reqs[i].max_new:  # SGLang checks the length first
                        continue
                    if tok in reqs[i].stops:
                        reasons[i], matched[i] = "stop", tok
                        continue
                    still.append(row)
                if not still:
                    break
                if len(still) < len(active):
                    keep = torch.tensor(still, dtype=torch.long)
                    cache.batch_select_indices(keep.to(self.device))
                    key_real = key_real[keep]
                active = [active[row] for row in still]
                key_real = torch.cat([key_real, torch.ones((len(active), 1), dtype=torch.bool)], dim=1)
                step = self.model(
                    input_ids=torch.tensor([[tokens[i][-1]] for i in active], device=self.device),
                    attention_mask=self._mask(key_real[:, None, None, :]),
                    position_ids=torch.tensor(
                        [[lengths[i] + len(tokens[i]) - 1] for i in active], device=self.device
                    ),
                    past_key_values=cache,
                    use_cache=True,
                )
                logits = step.logits[:, -1].float()
        answers = []
        for i in range(batch):
            if lps[i] and not math.isfinite(sum(lps[i])):
                raise RuntimeError("non-finite log-probabilities from the model")
            answers.append(TokenAnswer(tokens[i], lps[i], reasons[i], matched[i]))
        return answers

    def _mask(self, allowed: torch.Tensor) -> torch.Tensor:
        """The bool mask for sdpa; eager adds its mask to the scores, so it gets the additive form
        (a bool mask there is silently wrong)."""
        allowed = allowed.to(self.device)
        if getattr(self.model.config, "_attn_implementation", "sdpa") == "eager":
            dtype = next(self.model.parameters()).dtype
            return torch.zeros(allowed.shape, dtype=dtype, device=self.device).masked_fill(
                ~allowed, torch.finfo(dtype).min
            )
        return allowed

    def _choose(
        self,
        logits: torch.Tensor,
        reqs: list[_Request],
        histories: list[list[int]],
        sample_positions: list[int],
    ) -> tuple[list[int], list[float]]:
        """One token per row of ``logits`` ``(n, vocab)``, with each request's penalty and sampler."""
        scores = logits
        penalties = [r.penalty for r in reqs]
        if any(p != 1.0 and h for p, h in zip(penalties, histories, strict=True)):
            scores = apply_repetition_penalty(scores, histories, penalties)
        n = scores.shape[0]
        chosen = torch.zeros(n, dtype=torch.long, device=scores.device)
        chosen_lp = torch.zeros(n, dtype=torch.float32, device=scores.device)
        groups: dict[tuple[float, int, float], list[int]] = {}
        for row, req in enumerate(reqs):
            groups.setdefault(req.sampler, []).append(row)
        for (temperature, top_k, top_p), rows in groups.items():
            idx = torch.tensor(rows, dtype=torch.long, device=scores.device)
            group = scores[idx]
            if temperature < 1e-6:
                picked = group.argmax(-1)
                logp = torch.log_softmax(group, -1)
            else:
                probs = torch.softmax(filter_logits(group, temperature, top_k, top_p), dim=-1)
                seeded = [
                    self.deterministic or (self.seed_requests and reqs[r].seed is not None) for r in rows
                ]
                picked = torch.zeros(len(rows), dtype=torch.long, device=scores.device)
                free = [j for j, s in enumerate(seeded) if not s]
                if free:  # one draw of the server-wide generator for the unseeded rows, as one batch
                    picked[free] = torch.multinomial(probs[free], 1, generator=self.generator)[:, 0]
                for j, r in enumerate(rows):
                    if seeded[j]:
                        gen = _seeded_generator(
                            int(reqs[r].seed if reqs[r].seed is not None else 42), sample_positions[r], self.device
                        )
                        picked[j] = torch.multinomial(probs[j : j + 1], 1, generator=gen)[0, 0]
                logp = torch.log_softmax(group if self.return_original_logprob else group / temperature, -1)
            chosen[idx] = picked
            chosen_lp[idx] = logp.gather(-1, picked[:, None])[:, 0]
        return [int(t) for t in chosen.tolist()], [float(v) for v in chosen_lp.tolist()]

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
