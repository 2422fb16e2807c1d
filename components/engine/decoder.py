"""The torch decode loop: a batch of prompts, one shared cache, sequential or native parallel decoding.

Each sequence has a main stream; in parallel mode an admitted fork suspends it and starts one stream per
plan. Every step feeds one pending token per active stream (Q = the most active streams of any row),
with explicit ``position_ids`` and the owner mask of ``kv_layout``; the logits then give each stream its
next token (sampled, or forced: a branch's label, a ``</step>`` at ``max_step_tokens``, a response prefix).
Sequential mode is the same loop with forking off (Q = 1), so both modes share one tested code path.

Finish reasons: ``stop`` (end-of-turn sampled in the main stream), ``length`` (``max_new_tokens`` spent
across all branches), ``kv_budget`` (``kv_budget_tokens`` reached). A sequence that runs out of budget
inside a block keeps its partial branches in plan order; the log-probabilities of openers whose flat
predecessor was never fed are NaN (such a response is malformed and no trainer uses it).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

from components.engine.config import GenerationConfig
from components.engine.generation import BlockRecord, Generation
from components.engine.kv_cache import growing_cache
from components.engine.kv_layout import PAD, SHARED, SlotOwners
from components.engine.ledger import TokenLedger
from components.engine.parallel import Branch, EngineTags, OpenBlock, plan_fork
from components.engine.sampling import apply_repetition_penalty, choose_tokens


@dataclass
class _Sequence:
    """Decode state of one prompt."""

    prompt_ids: list[int]
    ledger: TokenLedger
    forced_queue: list[int]
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    position_ids: list[int] = field(default_factory=list)
    forced: list[bool] = field(default_factory=list)
    cursor: int = 0
    pending: int | None = None
    block: OpenBlock | None = None
    blocks: list[BlockRecord] = field(default_factory=list)
    refusals: list[str] = field(default_factory=list)
    finish_reason: str | None = None
    stop_token_id: int | None = None
    stop_logprob: float | None = None
    guideline_at: int | None = None  # response index of the main stream's open <guideline>

    def append(self, token: int, logprob: float, forced: bool, tags: EngineTags | None) -> None:
        self.token_ids.append(token)
        self.logprobs.append(logprob)
        self.position_ids.append(self.cursor)
        self.forced.append(forced)
        self.pending = token
        self.cursor += 1
        if tags is not None and token == tags.guideline_open:
            self.guideline_at = len(self.token_ids) - 1

    def streams(self) -> list[Any]:
        """Streams that feed a token this step: the main stream, or the unfinished branches."""
        if self.finish_reason is not None:
            return []
        if self.block is not None:
            return [b for b in self.block.branches if not b.done]
        return [self]


def end_of_turn_ids(tokenizer: Any) -> list[int]:
    """Token ids that end an assistant turn: ``<|im_end|>`` when the vocabulary has it, and eos."""
    ids = []
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    if isinstance(im_end, int) and im_end != tokenizer.unk_token_id and im_end is not None:
        ids.append(im_end)
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    if not ids:
        raise ValueError("tokenizer has neither <|im_end|> nor an eos token: cannot tell where a turn ends")
    return ids


class Decoder:
    """Decodes one batch of already tokenised prompts with a Hugging Face causal LM."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        cfg: GenerationConfig,
        tags: EngineTags | None,
        generator: torch.Generator,
    ) -> None:
        if cfg.mode == "parallel" and tags is None:
            raise ValueError("mode='parallel' needs the tag ids (tags=TagIds.from_tokenizer(...))")
        if cfg.mode == "parallel" and cfg.max_depth > 1:
            raise ValueError(
                "max_depth > 1: nested parallel blocks are not supported (the NPR schema has no steps inside "
                "steps); set generation.max_depth to 1"
            )
        self.model = model
        self.tokenizer = tokenizer
        self.cfg = cfg
        self.tags = tags
        self.generator = generator
        self.stop_ids = end_of_turn_ids(tokenizer)
        pad = tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else self.stop_ids[0]
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype

    # ------------------------------------------------------------------ public
    @torch.no_grad()
    def run(self, prompts: list[list[int]], prefixes: list[list[int]] | None = None) -> list[Generation]:
        start = time.perf_counter()
        seqs = [
            _Sequence(
                prompt_ids=list(p),
                ledger=TokenLedger(self.cfg.max_new_tokens, len(p), self.cfg.kv_budget_tokens),
                forced_queue=list(prefixes[i]) if prefixes else [],
                cursor=len(p),
            )
            for i, p in enumerate(prompts)
        ]
        for s in seqs:
            if not s.prompt_ids:
                raise ValueError("empty prompt: a prompt must have at least one token")
            if s.ledger.remaining == 0:
                s.finish_reason = s.ledger.exhausted_reason
        # Room for the prompt and a whole sequential response; parallel blocks may grow it (doubling).
        width = max((len(s.prompt_ids) for s in seqs), default=0)
        cache = growing_cache(self.model, width + self.cfg.max_new_tokens + 1)
        live = [i for i, s in enumerate(seqs) if s.finish_reason is None]
        if live:
            owners, logits = self._prefill([seqs[i] for i in live], cache)
            self._advance([seqs[i] for i in live], [[seqs[i]] for i in live], logits[:, None, :])
            while True:
                keep = [k for k, i in enumerate(live) if seqs[i].finish_reason is None]
                if not keep:
                    break
                if len(keep) < len(live):
                    idx = torch.tensor(keep, dtype=torch.long)
                    cache.batch_select_indices(idx.to(self.device))
                    owners.select_rows(idx)
                    live = [live[k] for k in keep]
                rows = [seqs[i] for i in live]
                streams = [s.streams() for s in rows]
                logits = self._step(streams, owners, cache)
                self._advance(rows, streams, logits)
                for r, s in enumerate(rows):
                    if s.block is not None and s.block.all_done and s.finish_reason is None:
                        self._merge(s, owners, r)
        wall = time.perf_counter() - start
        return [self._result(s, wall) for s in seqs]

    # ------------------------------------------------------------------ model calls
    def _prefill(self, rows: list[_Sequence], cache: Any) -> tuple[SlotOwners, torch.Tensor]:
        """Left-padded prefill of all prompts; returns the owners and the last-position logits ``(B, V)``."""
        width = max(len(s.prompt_ids) for s in rows)
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        pos = torch.zeros((len(rows), width), dtype=torch.long)
        real = torch.zeros((len(rows), width), dtype=torch.bool)
        for r, s in enumerate(rows):
            n = len(s.prompt_ids)
            ids[r, width - n :] = torch.tensor(s.prompt_ids)
            pos[r, width - n :] = torch.arange(n)
            real[r, width - n :] = True
        owners = SlotOwners.for_prefill(real)
        out = self.model(
            input_ids=ids.to(self.device),
            attention_mask=owners.prefill_mask(self.dtype).to(self.device),
            position_ids=pos.to(self.device),
            past_key_values=cache,
            use_cache=True,
        )
        return owners, out.logits[:, -1, :].float().cpu()

    def _step(self, streams: list[list[Any]], owners: SlotOwners, cache: Any) -> torch.Tensor:
        """Feed every active stream's pending token; returns logits ``(B, Q, V)``."""
        width = max(len(s) for s in streams)
        # Plain lists first, one tensor each: element-wise tensor writes cost microseconds apiece.
        ids = [[self.pad_id] * width for _ in streams]
        pos = [[0] * width for _ in streams]
        own_rows = [[PAD] * width for _ in streams]
        for r, row in enumerate(streams):
            for q, st in enumerate(row):
                ids[r][q] = st.pending
                pos[r][q] = st.cursor - 1
                own_rows[r][q] = st.index if isinstance(st, Branch) else SHARED
        own = torch.tensor(own_rows, dtype=torch.long)
        mask = owners.append(own, self.dtype)
        out = self.model(
            input_ids=torch.tensor(ids, dtype=torch.long, device=self.device),
            attention_mask=mask.to(self.device),
            position_ids=torch.tensor(pos, dtype=torch.long, device=self.device),
            past_key_values=cache,
            use_cache=True,
        )
        return out.logits.float().cpu()

    # ------------------------------------------------------------------ choosing tokens
    def _advance(self, rows: list[_Sequence], streams: list[list[Any]], logits: torch.Tensor) -> None:
        """Give every stream that was just fed its next token (forced or sampled)."""
        logp = torch.log_softmax(logits, dim=-1)
        to_sample: list[tuple[_Sequence, Any, int, int]] = []
        for r, (seq, row) in enumerate(zip(rows, streams, strict=True)):
            for q, st in enumerate(row):
                if seq.finish_reason is not None:
                    break
                if isinstance(st, Branch):
                    if self._branch_forced(seq, st, logp, r, q):
                        continue
                elif self._main_forced(seq, logp, r, q):
                    continue
                to_sample.append((seq, st, r, q))
        if not to_sample:
            return
        # One gather for all sampled streams instead of one indexing op per stream (~5% of a batch-256 loop).
        r_idx = torch.tensor([r for _, _, r, _ in to_sample])
        q_idx = torch.tensor([q for _, _, _, q in to_sample])
        rows_logits = logits[r_idx, q_idx]
        in_step = [isinstance(st, Branch) for _, st, _, _ in to_sample]
        penalty = self.cfg.step_repetition_penalty
        rows_logits = apply_repetition_penalty(
            rows_logits,
            [st.token_ids if b else [] for (_, st, _, _), b in zip(to_sample, in_step, strict=True)],
            [penalty if b else 1.0 for b in in_step],
        )
        # A step cannot end the turn: inside a branch end-of-turn is not a candidate (it ends at </step>).
        banned = torch.zeros_like(rows_logits, dtype=torch.bool)
        branch_rows = [k for k, b in enumerate(in_step) if b]
        if branch_rows:
            banned[torch.tensor(branch_rows)[:, None], torch.tensor(self.stop_ids)[None, :]] = True
        chosen_t = choose_tokens(
            rows_logits, self.cfg.temperature, self.cfg.top_k, self.cfg.top_p, self.generator, banned
        )
        chosen = chosen_t.tolist()
        chosen_lp = logp[r_idx, q_idx, chosen_t].tolist()
        for (seq, st, _, _), tok, lp in zip(to_sample, chosen, chosen_lp, strict=True):
            if seq.finish_reason is not None:
                continue
            if isinstance(st, Branch):
                self._charge_and_append(seq, st, tok, lp, forced=False)
            elif tok in self.stop_ids:
                seq.finish_reason, seq.stop_token_id, seq.stop_logprob = "stop", tok, lp
            else:
                self._charge_and_append(seq, seq, tok, lp, forced=False)

    def _main_forced(self, seq: _Sequence, logp: torch.Tensor, r: int, q: int) -> bool:
        """Handle the main stream's non-sampled cases; True if its next token is settled.

        ``logp[r, q]`` is this stream's next-token distribution (indexed only when a token is forced).
        """
        tags = self.tags
        if (
            self.cfg.mode == "parallel"
            and tags is not None
            and seq.pending == tags.guideline_close
            and seq.token_ids  # the </guideline> is a response token, not part of the prompt
            and self._try_fork(seq, logp[r, q])
        ):
            return True
        if seq.forced_queue:
            tok = seq.forced_queue.pop(0)
            self._charge_and_append(seq, seq, tok, float(logp[r, q, tok]), forced=True)
            return True
        return False

    def _branch_forced(self, seq: _Sequence, br: Branch, logp: torch.Tensor, r: int, q: int) -> bool:
        tags = self.tags
        assert tags is not None
        if br.pending == tags.step_close:
            br.done = True
            br.pending = None
            br.after_close = {"takeaway": float(logp[r, q, tags.takeaway_open])}
            return True
        if br.forced_queue:
            tok = br.forced_queue.pop(0)
        elif self.cfg.max_step_tokens is not None and len(br.token_ids) >= self.cfg.max_step_tokens - 1:
            tok = tags.step_close
        else:
            return False
        self._charge_and_append(seq, br, tok, float(logp[r, q, tok]), forced=True)
        return True

    def _charge_and_append(self, seq: _Sequence, stream: Any, tok: int, lp: float, forced: bool) -> None:
        if not seq.ledger.charge(1):
            self._finish(seq, seq.ledger.exhausted_reason)
            return
        if stream is seq:
            seq.append(tok, lp, forced, self.tags)
        else:
            stream.append(tok, lp, forced)

    # ------------------------------------------------------------------ fork / merge
    def _try_fork(self, seq: _Sequence, lp: torch.Tensor) -> bool:
        tags = self.tags
        assert tags is not None
        block_ids = seq.token_ids[seq.guideline_at :] if seq.guideline_at is not None else []
        decision = plan_fork(
            block_ids, self.tokenizer, tags, seq.ledger, self.cfg.max_branches, self.cfg.min_step_tokens
        )
        seq.guideline_at = None
        if isinstance(decision, str):
            seq.refusals.append(decision)
            return False
        g = seq.cursor - 1  # position of the </guideline> just fed
        branches = [
            Branch(index=j, label=lab, forced_queue=list(seed[1:]), cursor=g + 1)
            for j, (lab, seed) in enumerate(zip(decision.labels, decision.seeds, strict=True))
        ]
        seq.ledger.charge(len(branches))  # the <step> openers; admitted by plan_fork
        opener_lp = float(lp[tags.step_open])
        for br in branches:
            # Every branch opens from the </guideline> state: the canonical prediction rule
            # (components.parallel.prediction_sources), the same one SFT and RL score with.
            br.append(tags.step_open, opener_lp, forced=True)
        seq.block = OpenBlock(guideline_pos=g, start=len(seq.token_ids), plan=decision, branches=branches)
        return True

    def _flatten_block(self, seq: _Sequence, merged: bool) -> None:
        block = seq.block
        assert block is not None
        for br in block.branches:
            seq.token_ids += br.token_ids
            seq.logprobs += br.logprobs
            seq.position_ids += br.position_ids
            seq.forced += br.forced
        seq.blocks.append(
            BlockRecord(
                start=block.start,
                depth=1,
                labels=list(block.plan.labels),
                branch_tokens=[len(b.token_ids) for b in block.branches],
                merged=merged,
            )
        )
        seq.block = None

    def _merge(self, seq: _Sequence, owners: SlotOwners, row: int) -> None:
        """All branches ended: flatten them in plan order, share their KV, continue with <takeaway>."""
        tags = self.tags
        assert tags is not None and seq.block is not None
        block = seq.block
        takeaway_pos = block.takeaway_position()
        takeaway_lp = block.branches[-1].after_close["takeaway"]
        self._flatten_block(seq, merged=True)
        owners.merge_branches(row)
        seq.cursor = takeaway_pos
        self._charge_and_append(seq, seq, tags.takeaway_open, takeaway_lp, forced=True)

    def _finish(self, seq: _Sequence, reason: str) -> None:
        if seq.block is not None:
            self._flatten_block(seq, merged=False)
        seq.finish_reason = reason

    # ------------------------------------------------------------------ result
    def _result(self, seq: _Sequence, wall: float) -> Generation:
        if seq.block is not None:  # cannot happen after a clean finish; kept so nothing is ever dropped
            self._flatten_block(seq, merged=False)
        return Generation(
            prompt_ids=seq.prompt_ids,
            token_ids=seq.token_ids,
            text=self.tokenizer.decode(seq.token_ids, skip_special_tokens=False),
            logprobs=seq.logprobs,
            position_ids=seq.position_ids,
            forced=seq.forced,
            finish_reason=seq.finish_reason or "length",
            stop_token_id=seq.stop_token_id,
            stop_logprob=seq.stop_logprob,
            blocks=seq.blocks,
            fork_refusals=seq.refusals,
            wall_time_s=wall,
            backend="torch",
        )
