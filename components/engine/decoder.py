"""The torch backend of the fork/merge controller: a batch of sequences in one shared cache, on any device.

Each prompt has a ``SequenceController`` (``components.engine.controller``) that decides what to decode;
this module only serves its ``Extension`` requests. Every step feeds, for every row, the tokens its
streams need in the cache (Q = the widest row): a stream's last token, the trigger a fork starts from,
the branches' closing tokens at a merge; each with explicit ``position_ids`` and the owner mask of
``kv_layout``. The logits at those tokens then give every consuming stream its next token, forced or
sampled. Sequential mode is the same loop with forking off (Q = 1), so both modes share one tested path.

Merges (``merge_mode``):
- ``shared_kv`` (default, exact): the branches' KV stays where it was written and becomes visible to
  the main stream; positions are the canonical ones, so every log-probability equals the trainer's
  teacher-forced one under ``components.structure.parallel_attention_inputs``.
- ``reprefill``: what a server without a parallel mask does (SGLang's native API): the branch slots are
  hidden and the branches are fed again as one sequential text at sequential positions; everything after
  the first merge then continues at sequential positions. Used to measure that approximation
  (benchmarks/bench_merge.py) against the exact mode on the same model and prompts.

Memory: the KV cache grows with what is generated (``kv_cache.GrowingLayer`` doubles), never sized for
``max_new_tokens`` up front; the prefill computes the last position's logits only; and per step only the
chosen tokens and their log-probabilities leave the device (one ``(2, n)`` transfer), never the logits.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

from components.engine.config import GenerationConfig
from components.engine.controller import (
    MAIN,
    DecodePolicy,
    Extension,
    ExtensionResult,
    MergeMode,
    SequenceController,
    end_of_turn_ids,
)
from components.engine.generation import Generation
from components.engine.kv_cache import growing_cache
from components.engine.kv_layout import PAD, SHARED, SlotOwners
from components.engine.sampling import apply_repetition_penalty, choose_tokens

__all__ = ["Decoder", "end_of_turn_ids"]

# KV slots reserved per row before the first decode step beyond the prompt; the cache doubles from there.
INITIAL_DECODE_SLOTS = 64


@dataclass
class _Stream:
    """Backend state of one stream of one row: the request it serves and its token not yet in the cache."""

    ext: Extension | None = None
    forced: list[int] = field(default_factory=list)
    n_sampled: int = 0
    ids: list[int] = field(default_factory=list)
    lps: list[float] = field(default_factory=list)
    pending: int | None = None  # the last token appended, fed at the next step that needs it
    position: int = 0  # the position that token is fed at
    history: list[int] = field(default_factory=list)  # this stream's tokens (the repetition penalty's view)


@dataclass
class _Row:
    ctl: SequenceController
    streams: dict[int, _Stream] = field(default_factory=dict)
    todo: list[Extension] = field(default_factory=list)
    fork_context: int = 0  # flat context length at the open block's fork (re-prefill merges)


@dataclass
class _Consumer:
    """A stream that takes its next token from the logits of one fed token of its row."""

    row: int
    feed: int
    stream: _Stream


class Decoder:
    """Decodes batches of already tokenised prompts with a Hugging Face causal LM."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        cfg: GenerationConfig,
        tags: Any | None,
        generator: torch.Generator,
        merge_mode: MergeMode = "shared_kv",
    ) -> None:
        self.policy = DecodePolicy.from_config(cfg, tokenizer, tags)
        self.model = model
        self.tokenizer = tokenizer
        self.cfg = cfg
        self.generator = generator
        self.merge_mode = merge_mode
        self.stop_ids = list(self.policy.end_ids)
        pad = tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else self.stop_ids[0]
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype

    # ------------------------------------------------------------------ public
    @torch.no_grad()
    def run(
        self,
        prompts: list[list[int]],
        prefixes: list[list[int]] | None = None,
        seeds: list[int] | None = None,
    ) -> list[Generation]:
        """Decode one batch; ``seeds`` are the controllers' sequence seeds (request seeds derive from them;
        this backend samples from its one ``torch.Generator``)."""
        start = time.perf_counter()
        ctls = [
            SequenceController(
                p,
                self.policy,
                seed=seeds[i] if seeds else i,
                forced_prefix=prefixes[i] if prefixes else (),
            )
            for i, p in enumerate(prompts)
        ]
        rows = [_Row(ctl=c, todo=c.start()) for c in ctls]
        live = [r for r in rows if not r.ctl.done]
        if live:
            width = max(len(r.ctl.prompt_ids) for r in live)
            cache = growing_cache(self.model, width + min(self.cfg.max_new_tokens, INITIAL_DECODE_SLOTS) + 1)
            owners, logits = self._prefill(live, cache)
            first = []
            for k, r in enumerate(live):
                main = _Stream()
                self._begin(main, r.todo.pop())
                r.streams[MAIN] = main
                first.append(_Consumer(k, 0, main))
            self._choose(live, first, logits)
            while True:
                keep = [k for k, r in enumerate(live) if not r.ctl.done]
                if not keep:
                    break
                if len(keep) < len(live):
                    idx = torch.tensor(keep, dtype=torch.long, device=self.device)
                    cache.batch_select_indices(idx)
                    owners.select_rows(idx)
                    live = [live[k] for k in keep]
                self._step(live, owners, cache)
        wall = time.perf_counter() - start
        return [c.generation(backend="torch", merge_mode=self.merge_mode, wall_time_s=wall) for c in ctls]

    # ------------------------------------------------------------------ model calls
    def _prefill(self, rows: list[_Row], cache: Any) -> tuple[SlotOwners, torch.Tensor]:
        """Left-padded prefill of all prompts; returns the owners and the last-position logits ``(B, 1, V)``."""
        width = max(len(r.ctl.prompt_ids) for r in rows)
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        pos = torch.zeros((len(rows), width), dtype=torch.long)
        real = torch.zeros((len(rows), width), dtype=torch.bool)
        for k, r in enumerate(rows):
            n = len(r.ctl.prompt_ids)
            ids[k, width - n :] = torch.tensor(r.ctl.prompt_ids)
            pos[k, width - n :] = torch.arange(n)
            real[k, width - n :] = True
        owners = SlotOwners.for_prefill(real.to(self.device))
        out = self.model(
            input_ids=ids.to(self.device),
            attention_mask=owners.prefill_mask(self.dtype),
            position_ids=pos.to(self.device),
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,  # the prompt's other positions are never read
        )
        return owners, out.logits

    def _step(self, rows: list[_Row], owners: SlotOwners, cache: Any) -> None:
        """Feed what every row needs, then give every consuming stream its next token."""
        feeds: list[list[tuple[int, int, int]]] = []  # per row: (token, position, owner)
        consumers: list[list[_Consumer]] = []
        merges: list[int] = []
        for k, row in enumerate(rows):
            row_feeds, row_cons, merged = self._plan_row(k, row, owners)
            feeds.append(row_feeds)
            consumers.append(row_cons)
            if merged:
                merges.append(k)
        width = max(len(f) for f in feeds)
        # Plain lists first, one tensor each: element-wise tensor writes cost microseconds apiece.
        ids = [[self.pad_id] * width for _ in feeds]
        pos = [[0] * width for _ in feeds]
        own_rows = [[PAD] * width for _ in feeds]
        for k, row_feeds in enumerate(feeds):
            for q, (tok, p, o) in enumerate(row_feeds):
                ids[k][q], pos[k][q], own_rows[k][q] = tok, p, o
        mask = owners.append(torch.tensor(own_rows, dtype=torch.long), self.dtype)
        out = self.model(
            input_ids=torch.tensor(ids, dtype=torch.long, device=self.device),
            attention_mask=mask,
            position_ids=torch.tensor(pos, dtype=torch.long, device=self.device),
            past_key_values=cache,
            use_cache=True,
        )
        if self.merge_mode == "shared_kv":
            for k in merges:
                owners.merge_branches(k)
        flat = [c for row_cons in consumers for c in row_cons]
        self._choose(rows, flat, out.logits)

    def _plan_row(
        self, k: int, row: _Row, owners: SlotOwners
    ) -> tuple[list[tuple[int, int, int]], list[_Consumer], bool]:
        """The tokens row ``k`` feeds this step, the streams that consume their logits, whether it merges."""
        feeds: list[tuple[int, int, int]] = []
        cons: list[_Consumer] = []
        merged = False
        new, row.todo = row.todo, []
        forks = [e for e in new if e.is_fork]
        if forks:
            main = row.streams[MAIN]
            assert main.pending is not None, "a fork starts from the trigger the main stream just wrote"
            feeds.append((main.pending, main.position, SHARED))
            main.pending = None
            row.fork_context = forks[0].context_length
            for ext in forks:
                st = _Stream()
                self._begin(st, ext)
                row.streams[ext.stream] = st
                cons.append(_Consumer(k, 0, st))
        for ext in new:
            if ext.is_fork:
                continue
            if ext.is_merge:
                cons.append(self._plan_merge(k, row, ext, feeds, owners))
                merged = True
                continue
            st = row.streams[ext.stream]
            self._begin(st, ext)
        for key, st in row.streams.items():
            if st.ext is None or any(c.stream is st for c in cons):
                continue
            assert st.pending is not None, f"stream {key} has a request but nothing to feed"
            cons.append(_Consumer(k, len(feeds), st))
            feeds.append((st.pending, st.position, SHARED if key == MAIN else key))
            st.pending = None
        if not feeds:
            raise RuntimeError("a live sequence has nothing to decode (controller and backend disagree)")
        return feeds, cons, merged

    def _plan_merge(
        self, k: int, row: _Row, ext: Extension, feeds: list[tuple[int, int, int]], owners: SlotOwners
    ) -> _Consumer:
        """Feed what the merge needs and return the main stream as the consumer of the right logits."""
        assert ext.merge is not None
        branches = {j: row.streams.pop(j) for j in ext.merge}
        if self.merge_mode == "shared_kv":
            # each branch's last token (its </step>) enters the cache under the branch's own owner
            source = 0
            for j in ext.merge:
                st = branches[j]
                assert st.pending is not None
                if j == ext.after:
                    source = len(feeds)
                feeds.append((st.pending, st.position, j))
        else:
            # the branches are read again as one sequential text, their own slots hidden
            owners.hide_branches(k)
            text = row.ctl.context_ids(ext)[row.fork_context : ext.context_length]
            for i, tok in enumerate(text):
                feeds.append((tok, row.fork_context + i, SHARED))
            source = len(feeds) - 1
        main = row.streams[MAIN]
        main.history = []
        self._begin(main, ext)
        return _Consumer(k, source, main)

    @staticmethod
    def _begin(st: _Stream, ext: Extension) -> None:
        st.ext = ext
        st.forced = list(ext.forced)
        st.n_sampled = 0
        st.ids = []
        st.lps = []

    # ------------------------------------------------------------------ choosing tokens
    def _choose(self, rows: list[_Row], consumers: list[_Consumer], logits: torch.Tensor) -> None:
        """Forced or sampled next token for every consumer; only ``(2, n)`` numbers leave the device."""
        r_idx = torch.tensor([c.row for c in consumers], device=logits.device)
        q_idx = torch.tensor([c.feed for c in consumers], device=logits.device)
        step_logits = logits[r_idx, q_idx].float()  # (n, V)
        logp = torch.log_softmax(step_logits, dim=-1)
        forced_tok = [c.stream.forced[0] if c.stream.forced else -1 for c in consumers]
        sample_rows = [i for i, t in enumerate(forced_tok) if t < 0]
        tokens = torch.tensor([max(t, 0) for t in forced_tok], dtype=torch.long, device=logits.device)
        if sample_rows:
            sel = torch.tensor(sample_rows, device=logits.device)
            exts = [consumers[i].stream.ext for i in sample_rows]
            penalties = [e.repetition_penalty for e in exts]
            rows_logits = step_logits[sel]
            if any(p != 1.0 for p in penalties):
                rows_logits = apply_repetition_penalty(
                    rows_logits, [consumers[i].stream.history for i in sample_rows], penalties
                )
            banned = None
            ban_rows = [(m, e.banned_ids) for m, e in enumerate(exts) if e.banned_ids]
            if ban_rows:
                banned = torch.zeros_like(rows_logits, dtype=torch.bool)
                for m, ids in ban_rows:
                    banned[m, list(ids)] = True
            chosen = choose_tokens(
                rows_logits, self.cfg.temperature, self.cfg.top_k, self.cfg.top_p, self.generator, banned
            )
            tokens[sel] = chosen
        lps = logp.gather(-1, tokens[:, None]).squeeze(-1)
        # token ids are below 2**24, so float32 carries them exactly: one transfer for both
        host = torch.stack([tokens.to(lps.dtype), lps]).tolist()
        for i, c in enumerate(consumers):
            self._append(rows[c.row], c.stream, int(host[0][i]), host[1][i], forced_tok[i] >= 0)

    def _append(self, row: _Row, st: _Stream, tok: int, lp: float, was_forced: bool) -> None:
        ext = st.ext
        assert ext is not None
        if was_forced:
            st.forced.pop(0)
        else:
            st.n_sampled += 1
        st.ids.append(tok)
        st.lps.append(lp)
        st.history.append(tok)
        st.pending = tok
        st.position = self._token_position(st, ext)
        stopped = not was_forced and tok in ext.stop_ids
        if not st.forced and (stopped or st.n_sampled == ext.max_sampled):
            st.ext = None
            result = ExtensionResult(st.ids, st.lps, "stop" if stopped else "length")
            row.todo += row.ctl.advance(ext, result)

    def _token_position(self, st: _Stream, ext: Extension) -> int:
        """Position of the stream's latest token: the request's first position + its index in the request."""
        first = ext.position if self.merge_mode == "shared_kv" else ext.context_length
        return first + len(st.ids) - 1
