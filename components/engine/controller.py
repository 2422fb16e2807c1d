"""The fork/merge controller: every decision of native parallel decoding, with no model and no I/O.

One ``SequenceController`` per response. It never computes a logit; it says what to decode next as
``Extension`` requests ("extend this stream by these forced tokens, then sample at most N tokens, stopping
after any of these ids, with this seed") and consumes their results (token ids, log-probabilities, finish
reason). Every backend drives the same controller, so forks, refusals, budgets and positions are decided
once:

- the torch engine (``components.engine.decoder``) serves requests token by token, many sequences and
  streams per forward pass, with the branches sharing the prefix KV and merging without recomputation
  (``merge_mode="shared_kv"``);
- the async driver (``components.engine.async_driver``) serves them with any
  ``async generate(prompt_ids, sampling_params)``: SGLang's native ``/generate`` over HTTP
  (``backends/sglang_client.py``) or verl's agent-loop ``server_manager.generate``. Branches are separate
  requests sharing the prefix (the radix cache shares its KV; branch positions restart after the prefix,
  as the trainer's do); a merge is a new request whose prompt is prefix + all branches, re-prefilled
  (``merge_mode="reprefill"``).

Streams: ``MAIN`` (-1) is the response's main stream; while a block is open its branches are streams
``0..k-1`` (plan order). Decisions, in the order they happen:

1. The main stream decodes until end-of-turn, its budget, or (parallel mode) the schema's fork trigger
   (NPR: ``</guideline>``). A forced response prefix is fed first, split at each trigger it contains.
2. At a trigger, ``parallel.plan_fork`` admits the fork (one branch per plan, seeded with ``<step>`` +
   label) or refuses it with a reason (recorded; the main stream goes on).
3. Each branch gets an allowance of the token budget (``ledger.branch_allowances``) and decodes until
   ``</step>``; ``max_step_tokens`` closes a runaway branch with a forced ``</step>``. End-of-turn is
   banned inside a step: the torch engine masks it; a server that cannot ban it without changing the
   log-probs it returns stops there instead, and the controller drops that token and draws again (a
   rejection sample of the banned distribution, the same distribution), at most
   ``MAX_BANNED_REDRAWS`` times per branch, after which the branch ends the response, unmerged.
4. When every branch has closed, the merge: ``<takeaway>`` is forced into the main stream, predicted from
   the last branch's last token, at position G + longest + 1 (G = the trigger's position).
5. A budget that runs out inside a block ends the response (``length`` / ``kv_budget``) with the partial
   branches kept in plan order, unmerged.

Canonical layout and positions are the ones ``components.structure.parallel_attention_inputs`` gives the
trainer; ``Generation.logprobs`` are what the backend returned (NaN for a forced token a backend could not
score).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from components.engine.config import GenerationConfig
from components.engine.generation import BlockRecord, Generation
from components.engine.ledger import TokenLedger, branch_allowances
from components.engine.parallel import ForkPlan, ForkTags, plan_fork

MAIN = -1
# Redraws of a banned token (end-of-turn inside a step) a branch gets before it may end the response.
MAX_BANNED_REDRAWS = 8

Finish = Literal["stop", "length", "abort"]
MergeMode = Literal["shared_kv", "reprefill"]


class ControllerError(RuntimeError):
    """A backend returned something the request it answers does not allow (too many tokens, no stop)."""


@dataclass(frozen=True)
class Extension:
    """One request to a backend: extend stream ``stream`` of a sequence.

    Append ``forced`` (teacher-forced: the backend returns their log-probs), then sample at most
    ``max_sampled`` tokens, stopping right after any token of ``stop_ids`` (the stop token is returned).
    ``banned_ids`` may not be sampled (a backend that cannot ban them treats them as stops).

    Attributes:
        stream: ``MAIN`` or the branch index in the open block.
        after: the stream whose last token predicts the first new token: the stream itself when it
            continues, ``MAIN`` for a branch's first request (it forks from the trigger), the last branch
            for the merge.
        merge: for the main stream's first request after a block, the branches it makes visible (all of
            them, plan order); ``None`` otherwise.
        position: canonical position of the first new token.
        context_length: tokens before the first new token in this stream's flat context
            (``SequenceController.context_ids``), which is the position a sequential server gives it.
        seed: this request's sampling seed (derived from the sequence seed, the block, the stream and the
            request's rank, so it does not depend on which request finished first).
        repetition_penalty: CTRL-style penalty on the stream's own tokens (inside steps; 1 = none).
        block: index of the open block (-1 outside blocks).
    """

    stream: int
    forced: tuple[int, ...]
    max_sampled: int
    stop_ids: frozenset[int]
    seed: int
    after: int
    position: int
    context_length: int
    merge: tuple[int, ...] | None = None
    banned_ids: tuple[int, ...] = ()
    repetition_penalty: float = 1.0
    block: int = -1

    @property
    def is_merge(self) -> bool:
        return self.merge is not None

    @property
    def is_fork(self) -> bool:
        return self.stream != MAIN and self.after == MAIN


@dataclass
class ExtensionResult:
    """A backend's answer to an ``Extension``.

    token_ids: the forced tokens, then the sampled ones (a matched stop token last).
    logprobs: one per token: ``log_softmax`` of the model's logits at the token's prediction source (NaN
        for a forced token the backend could not score).
    finish: ``stop`` (a stop token was sampled, or the server stopped on one of its own), ``length``
        (``max_sampled`` reached), ``abort`` (the server gave up; the controller raises).
    """

    token_ids: list[int]
    logprobs: list[float]
    finish: Finish = "stop"


@dataclass(frozen=True)
class DecodePolicy:
    """What the controller needs from the config, the tokenizer and the schema; shared by the sequences
    of one ``generate`` call.

    ``tokenizer`` decodes block text (plan labels) and responses and encodes branch labels; ``tags`` is
    None in sequential mode.
    """

    mode: Literal["sequential", "parallel"]
    end_ids: tuple[int, ...]
    max_new_tokens: int
    tokenizer: Any
    tags: ForkTags | None = None
    kv_budget_tokens: int | None = None
    max_branches: int = 5
    min_step_tokens: int = 1
    max_step_tokens: int | None = None
    step_repetition_penalty: float = 1.0

    def __post_init__(self) -> None:
        if self.mode == "parallel" and self.tags is None:
            raise ValueError("mode='parallel' needs the tag ids (tags=TagIds.from_tokenizer(...))")
        if not self.end_ids:
            raise ValueError("a decode policy needs at least one end-of-turn id")

    @classmethod
    def from_config(cls, cfg: GenerationConfig, tokenizer: Any, tags: Any | None) -> DecodePolicy:
        """From a ``GenerationConfig``; ``tags`` is a ``TagIds`` / ``ForkTags`` (required in parallel mode)."""
        if cfg.mode == "parallel" and cfg.max_depth > 1:
            raise ValueError(
                "max_depth > 1: nested parallel blocks are not supported (the NPR schema has no steps inside "
                "steps); set generation.max_depth to 1"
            )
        fork_tags = ForkTags.from_tag_ids(tags) if (tags is not None and cfg.mode == "parallel") else None
        if fork_tags is not None and cfg.paths is not None:
            if fork_tags.fixed_branches is None:
                raise ValueError(
                    f"generation.paths={cfg.paths}: schema {fork_tags.schema_name!r} forks one branch per plan; "
                    "paths applies to fork rules with a fixed number of branches (parallel_r1)"
                )
            fork_tags = dataclasses.replace(fork_tags, fixed_branches=cfg.paths)
        return cls(
            mode=cfg.mode,
            end_ids=tuple(end_of_turn_ids(tokenizer)),
            max_new_tokens=cfg.max_new_tokens,
            tokenizer=tokenizer,
            tags=fork_tags,
            kv_budget_tokens=cfg.kv_budget_tokens,
            max_branches=cfg.max_branches,
            min_step_tokens=cfg.min_step_tokens,
            max_step_tokens=cfg.max_step_tokens,
            step_repetition_penalty=cfg.step_repetition_penalty,
        )

    @property
    def main_stops(self) -> frozenset[int]:
        stops = set(self.end_ids)
        if self.mode == "parallel" and self.tags is not None:
            stops.add(self.tags.trigger)
        return frozenset(stops)


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


def request_seed(sequence_seed: int, block: int, stream: int, rank: int) -> int:
    """A 31-bit seed per request (splitmix64 of its identity): distinct for every branch and round."""
    x = (sequence_seed * 0x9E3779B97F4A7C15 + (block + 2) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    x = (x + (stream + 2) * 0x94D049BB133111EB + rank * 0x2545F4914F6CDD1D) & 0xFFFFFFFFFFFFFFFF
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    x ^= x >> 31
    return int(x & 0x7FFFFFFF)


@dataclass
class _Branch:
    """One branch of the open block (controller side)."""

    index: int
    label: str
    seed_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    forced: list[bool] = field(default_factory=list)
    allowance: int = 0  # tokens it may still spend in the current round
    state: Literal["running", "waiting", "closed", "ended_turn"] = "waiting"
    requests: int = 0
    redraws: int = 0


@dataclass
class _Block:
    number: int
    trigger_pos: int  # G: canonical position of the trigger
    start: int  # response index of the first branch token
    plan: ForkPlan
    branches: list[_Branch]

    @property
    def longest(self) -> int:
        return max(len(b.token_ids) for b in self.branches)


class SequenceController:
    """The decisions of one response, as a sans-IO state machine.

    Usage (any backend)::

        ctl = SequenceController(prompt_ids, policy, seed=s)
        todo = ctl.start()
        while todo:                       # or concurrently: each request's answer may come back any time
            ext = todo.pop()
            todo += ctl.advance(ext, backend.run(ext, ctl.context_ids(ext)))
        gen = ctl.generation(backend="torch", merge_mode="shared_kv")

    ``advance`` returns the requests that became possible (none while sibling branches are still running;
    one per branch at a fork). Requests of different streams may be in flight together; ``advance`` may
    be called for them in any order.
    """

    def __init__(
        self,
        prompt_ids: Sequence[int],
        policy: DecodePolicy,
        seed: int = 0,
        forced_prefix: Sequence[int] = (),
    ) -> None:
        if not prompt_ids:
            raise ValueError("empty prompt: a prompt must have at least one token")
        self.policy = policy
        self.prompt_ids = list(prompt_ids)
        self.seed = seed
        self.ledger = TokenLedger(policy.max_new_tokens, len(self.prompt_ids), policy.kv_budget_tokens)
        self.token_ids: list[int] = []
        self.logprobs: list[float] = []
        self.position_ids: list[int] = []
        self.forced: list[bool] = []
        self.blocks: list[BlockRecord] = []
        self.refusals: list[str] = []
        self.finish_reason: str | None = None
        self.stop_token_id: int | None = None
        self.stop_logprob: float | None = None
        self._prefix = list(forced_prefix)
        self._cursor = len(self.prompt_ids)  # canonical position of the next main-stream token
        self._goal_at: int | None = None  # response index of the main stream's open goal tag
        self._block: _Block | None = None
        self._n_blocks = 0
        self._main_requests = 0

    # ------------------------------------------------------------------ public
    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    def start(self) -> list[Extension]:
        """The first request (none if the budget is zero)."""
        if self.ledger.remaining == 0:
            self._finish(self.ledger.exhausted_reason)
            return []
        return [self._main_extension()]

    def context_ids(self, ext: Extension) -> list[int]:
        """The token ids ``ext`` continues: prompt + the flat response so far (+ the branch's own tokens).

        During a block the flat response ends at the trigger, so a branch's context is prefix + itself and
        the merge's (after the block is flattened) is prefix + every branch in plan order.
        """
        ids = self.prompt_ids + self.token_ids
        if ext.stream != MAIN:
            assert self._block is not None
            ids = ids + self._block.branches[ext.stream].token_ids
        return ids

    def advance(self, ext: Extension, result: ExtensionResult) -> list[Extension]:
        """Consume a backend's answer to ``ext``; returns the requests it makes possible."""
        if self.done:
            raise ControllerError("advance() on a finished sequence")
        n_forced = len(ext.forced)
        ids, lps = list(result.token_ids), list(result.logprobs)
        if len(ids) != len(lps):
            raise ControllerError(f"{len(ids)} token ids but {len(lps)} logprobs")
        if ids[:n_forced] != list(ext.forced):
            raise ControllerError(
                f"the backend did not echo the forced tokens {list(ext.forced)}: {ids[:n_forced]}"
            )
        if len(ids) - n_forced > ext.max_sampled:
            raise ControllerError(f"{len(ids) - n_forced} tokens sampled, at most {ext.max_sampled} asked")
        if result.finish == "abort":
            raise ControllerError("the backend aborted the request")
        if ext.stream == MAIN:
            return self._advance_main(ext, ids, lps, result.finish)
        return self._advance_branch(ext, ids, lps, result.finish)

    def generation(self, backend: str, merge_mode: MergeMode, wall_time_s: float = 0.0) -> Generation:
        """The finished response (the same object from every backend)."""
        if self._block is not None:  # only when a backend stopped early; nothing is ever dropped
            self._flatten_block(merged=False)
        return Generation(
            prompt_ids=self.prompt_ids,
            token_ids=self.token_ids,
            text=self.policy.tokenizer.decode(self.token_ids, skip_special_tokens=False),
            logprobs=self.logprobs,
            position_ids=self.position_ids,
            forced=self.forced,
            finish_reason=self.finish_reason or "length",
            stop_token_id=self.stop_token_id,
            stop_logprob=self.stop_logprob,
            blocks=self.blocks,
            fork_refusals=self.refusals,
            wall_time_s=wall_time_s,
            backend=backend,
            merge_mode=merge_mode,
        )

    # ------------------------------------------------------------------ main stream
    def _main_extension(self, merge: tuple[int, ...] | None = None, after: int = MAIN) -> Extension:
        """The main stream's next request: the next chunk of the forced prefix (up to and including a
        trigger, after which the fork decision must come first), then sampling within the budget."""
        pol = self.policy
        forced: list[int] = []
        if merge is not None:
            assert pol.tags is not None
            forced += list(pol.tags.merge)
        trigger = pol.tags.trigger if (pol.mode == "parallel" and pol.tags is not None) else None
        stop_at_trigger = False
        while self._prefix and not stop_at_trigger:
            tok = self._prefix.pop(0)
            forced.append(tok)
            stop_at_trigger = tok == trigger
        room = self.ledger.remaining
        if len(forced) > room:  # the budget ends inside the forced tokens: the rest is never written
            self._prefix = []
            forced = forced[:room]
            stop_at_trigger = False
        max_sampled = 0 if stop_at_trigger else room - len(forced)
        rank = self._main_requests
        self._main_requests += 1
        return Extension(
            stream=MAIN,
            forced=tuple(forced),
            max_sampled=max_sampled,
            stop_ids=pol.main_stops,
            seed=request_seed(self.seed, self._n_blocks, MAIN, rank),
            after=after,
            position=self._cursor,
            context_length=len(self.prompt_ids) + len(self.token_ids),
            merge=merge,
        )

    def _append_main(self, ids: list[int], lps: list[float], n_forced: int) -> None:
        goal = self.policy.tags.goal_open if self.policy.tags is not None else None
        for k, (tok, lp) in enumerate(zip(ids, lps, strict=True)):
            self.token_ids.append(tok)
            self.logprobs.append(lp)
            self.position_ids.append(self._cursor)
            self.forced.append(k < n_forced)
            self._cursor += 1
            if goal is not None and tok == goal:
                self._goal_at = len(self.token_ids) - 1

    def _advance_main(
        self, ext: Extension, ids: list[int], lps: list[float], finish: Finish
    ) -> list[Extension]:
        pol = self.policy
        n_forced = len(ext.forced)
        sampled = ids[n_forced:]
        ended = bool(sampled) and (sampled[-1] in pol.end_ids)
        # a server may stop early on an end-of-sequence id of its own (SGLang: the model's eos ids)
        if not ended and sampled and finish == "stop" and len(sampled) < ext.max_sampled:
            ended = sampled[-1] not in ext.stop_ids
        if ended:
            self.stop_token_id, self.stop_logprob = sampled[-1], lps[-1]
            ids, lps = ids[:-1], lps[:-1]
        if not self.ledger.charge(len(ids)):
            raise ControllerError(f"{len(ids)} tokens exceed the {self.ledger.remaining} left in the budget")
        self._append_main(ids, lps, n_forced)
        if ended:
            self._finish("stop")
            return []
        trigger = pol.tags.trigger if (pol.mode == "parallel" and pol.tags is not None) else None
        if ids and ids[-1] == trigger:
            fork = self._try_fork()
            if fork:
                return fork
            return self._continue_main()
        if len(sampled) < ext.max_sampled:
            raise ControllerError(
                f"the backend returned {len(sampled)} of at most {ext.max_sampled} tokens without a stop "
                f"token (finish {finish!r})"
            )
        if self.ledger.remaining == 0:
            self._finish(self.ledger.exhausted_reason)
            return []
        return self._continue_main()

    def _continue_main(self) -> list[Extension]:
        if self.ledger.remaining == 0:
            self._finish(self.ledger.exhausted_reason)
            return []
        return [self._main_extension()]

    # ------------------------------------------------------------------ fork
    def _try_fork(self) -> list[Extension]:
        pol = self.policy
        assert pol.tags is not None
        if pol.tags.fixed_branches is not None:
            block_ids = self.token_ids[-1:]
        else:
            block_ids = self.token_ids[self._goal_at :] if self._goal_at is not None else []
        decision = plan_fork(
            block_ids, pol.tokenizer, pol.tags, self.ledger, pol.max_branches, pol.min_step_tokens
        )
        self._goal_at = None
        if isinstance(decision, str):
            self.refusals.append(decision)
            return []
        branches = [
            _Branch(index=j, label=lab, seed_ids=list(seed))
            for j, (lab, seed) in enumerate(zip(decision.labels, decision.seeds, strict=True))
        ]
        self._block = _Block(
            number=self._n_blocks,
            trigger_pos=self._cursor - 1,
            start=len(self.token_ids),
            plan=decision,
            branches=branches,
        )
        floors = [len(b.seed_ids) + pol.min_step_tokens + 1 for b in branches]
        allowances = branch_allowances(self.ledger.remaining - pol.tags.merge_cost, floors)
        out = []
        for br, allowance in zip(branches, allowances, strict=True):
            br.allowance = allowance
            ext = self._branch_extension(br)
            assert ext is not None, "admission guarantees every branch its seed and a minimal step"
            out.append(ext)
        return out

    def _branch_extension(self, br: _Branch) -> Extension | None:
        """The branch's next request within its allowance, or None if it must wait for the next round."""
        pol = self.policy
        block = self._block
        assert pol.tags is not None and block is not None
        forced = list(br.seed_ids) if br.requests == 0 else []
        done_len = len(br.token_ids) + len(forced)
        step_room = math.inf if pol.max_step_tokens is None else pol.max_step_tokens - 1 - done_len
        if step_room <= 0:  # a runaway step: close it (the token a sequential reader would expect next)
            forced.append(pol.tags.branch_close)
            step_room = 0
        if br.allowance < len(forced):
            return None
        max_sampled = int(min(br.allowance - len(forced), step_room))
        if max_sampled == 0 and not forced:
            return None
        first = br.requests == 0
        rank = br.requests
        br.requests += 1
        br.state = "running"
        return Extension(
            stream=br.index,
            forced=tuple(forced),
            max_sampled=max_sampled,
            stop_ids=frozenset({pol.tags.branch_close}),
            seed=request_seed(self.seed, block.number, br.index, rank),
            after=MAIN if first else br.index,
            position=block.trigger_pos + 1 + len(br.token_ids),
            context_length=len(self.prompt_ids) + len(self.token_ids) + len(br.token_ids),
            banned_ids=pol.end_ids,
            repetition_penalty=pol.step_repetition_penalty,
            block=block.number,
        )

    def _advance_branch(
        self, ext: Extension, ids: list[int], lps: list[float], finish: Finish
    ) -> list[Extension]:
        pol = self.policy
        block = self._block
        if block is None or ext.block != block.number or not 0 <= ext.stream < len(block.branches):
            raise ControllerError(f"result for a branch that is not open: {ext}")
        assert pol.tags is not None
        br = block.branches[ext.stream]
        n_forced = len(ext.forced)
        sampled = ids[n_forced:]
        banned_stop = bool(sampled) and (
            sampled[-1] in pol.end_ids or (finish == "stop" and sampled[-1] not in ext.stop_ids)
        )
        redraw = banned_stop and br.redraws < MAX_BANNED_REDRAWS
        if redraw:  # the server could not ban it: drop it and draw that token again
            br.redraws += 1
            ids, lps, sampled = ids[:-1], lps[:-1], sampled[:-1]
        if len(ids) > br.allowance:
            raise ControllerError(f"branch {br.index} spent {len(ids)} tokens, allowance {br.allowance}")
        if not self.ledger.charge(len(ids)):
            raise ControllerError(f"{len(ids)} tokens exceed the {self.ledger.remaining} left in the budget")
        br.allowance -= len(ids)
        br.token_ids += ids
        br.logprobs += lps
        br.forced += [k < n_forced for k in range(len(ids))]
        last = ids[-1] if ids else None
        if last == pol.tags.branch_close and not redraw:
            br.state = "closed"
        elif banned_stop and not redraw:
            # end-of-turn inside a step, redraws spent: the response ends after this block
            br.state = "ended_turn"
        elif not redraw and len(sampled) < ext.max_sampled:
            raise ControllerError(
                f"branch {br.index}: {len(sampled)} of at most {ext.max_sampled} tokens and no stop token"
            )
        else:
            nxt = self._branch_extension(br)
            if nxt is not None:
                return [nxt]
            br.state = "waiting"
        return self._after_branch()

    def _after_branch(self) -> list[Extension]:
        """Called whenever a branch stops running: next round, merge, or finish, once none is running."""
        block = self._block
        assert block is not None and self.policy.tags is not None
        if any(b.state == "running" for b in block.branches):
            return []
        waiting = [b for b in block.branches if b.state == "waiting"]
        if waiting:
            left = self.ledger.remaining - self.policy.tags.merge_cost
            if left > 0:
                for br, allowance in zip(waiting, branch_allowances(left, [0] * len(waiting)), strict=True):
                    br.allowance = allowance
                out = [e for e in (self._branch_extension(b) for b in waiting) if e is not None]
                if out:
                    return out
            # the budget cannot close every branch: the response ends here, unmerged
            self._flatten_block(merged=False)
            self._finish(self.ledger.exhausted_reason)
            return []
        ended = [b for b in block.branches if b.state == "ended_turn"]
        if ended:
            stop_branch = ended[0]
            self.stop_token_id = stop_branch.token_ids.pop()
            self.stop_logprob = stop_branch.logprobs.pop()
            stop_branch.forced.pop()
            self.ledger.used -= 1  # the stop token is not a response token
            self._flatten_block(merged=False)
            self._finish("stop")
            return []
        # merge: the first token after the block is predicted from the last branch's last token
        trigger_pos = block.trigger_pos
        longest = block.longest
        last = len(block.branches) - 1
        self._flatten_block(merged=True)
        self._cursor = trigger_pos + longest + 1
        if self.ledger.remaining < self.policy.tags.merge_cost:
            self._finish(self.ledger.exhausted_reason)
            return []
        return [self._main_extension(merge=tuple(range(last + 1)), after=last)]

    def _flatten_block(self, merged: bool) -> None:
        block = self._block
        assert block is not None
        for br in block.branches:
            self.token_ids += br.token_ids
            self.logprobs += br.logprobs
            self.position_ids += range(block.trigger_pos + 1, block.trigger_pos + 1 + len(br.token_ids))
            self.forced += br.forced
        self.blocks.append(
            BlockRecord(
                start=block.start,
                depth=1,
                labels=list(block.plan.labels),
                branch_tokens=[len(b.token_ids) for b in block.branches],
                merged=merged,
            )
        )
        self._block = None
        self._n_blocks += 1

    def _finish(self, reason: str) -> None:
        if self._block is not None:
            self._flatten_block(merged=False)
        self.finish_reason = reason
