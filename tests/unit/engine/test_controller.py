"""The fork/merge controller alone: scripted answers, no model, so every decision is checked exactly."""

from __future__ import annotations

import math

import pytest

from components.engine.controller import (
    MAIN,
    MAX_BANNED_REDRAWS,
    ControllerError,
    DecodePolicy,
    ExtensionResult,
    SequenceController,
    end_of_turn_ids,
)
from components.models.tiny import tiny_test_world
from components.structure import TagIds

PLANS = "<guideline><plan>1: a</plan><plan>2: b</plan></guideline>"


@pytest.fixture(scope="module")
def tok():
    return tiny_test_world(seed=0)[1]


def _policy(tok, **kw) -> DecodePolicy:
    args = {
        "mode": "parallel",
        "end_ids": tuple(end_of_turn_ids(tok)),
        "max_new_tokens": 60,
        "tokenizer": tok,
        "tags": None,
        "max_step_tokens": None,
    }
    args.update(kw)
    if args["mode"] == "parallel" and args["tags"] is None:
        from components.engine.parallel import ForkTags

        args["tags"] = ForkTags.from_tag_ids(TagIds.from_tokenizer(tok, "npr"))
    return DecodePolicy(**args)


def _answer(ext, sampled: list[int], finish: str = "stop") -> ExtensionResult:
    ids = list(ext.forced) + sampled
    return ExtensionResult(ids, [-1.0] * len(ids), finish)  # type: ignore[arg-type]


def _ids(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


def test_sequential_request_and_end_of_turn(tok) -> None:
    pol = _policy(tok, mode="sequential", tags=None)
    ctl = SequenceController([1, 2, 3], pol, seed=5)
    (ext,) = ctl.start()
    assert ext.stream == MAIN and ext.max_sampled == 60 and set(ext.stop_ids) == set(pol.end_ids)
    assert ext.position == 3 and ext.context_length == 3
    eot = pol.end_ids[0]
    assert ctl.advance(ext, _answer(ext, [40, 41, eot])) == []
    gen = ctl.generation("test", "shared_kv")
    assert gen.finish_reason == "stop" and gen.token_ids == [40, 41] and gen.stop_token_id == eot
    assert gen.position_ids == [3, 4]


def _fork(tok, ctl):
    (first,) = ctl.start()
    assert (
        first.forced == tuple(_ids(tok, PLANS)) and first.max_sampled == 0
    )  # decision right after </guideline>
    branches = ctl.advance(first, _answer(first, [], "length"))
    return first, branches


def test_fork_branches_merge_and_positions(tok) -> None:
    pol = _policy(tok)
    tags = pol.tags
    prompt = [1, 2, 3, 4]
    ctl = SequenceController(prompt, pol, seed=1, forced_prefix=_ids(tok, PLANS))
    first, branches = _fork(tok, ctl)
    g = len(prompt) + len(first.forced) - 1  # position of </guideline>
    assert [b.stream for b in branches] == [0, 1] and all(b.after == MAIN and b.is_fork for b in branches)
    assert all(b.position == g + 1 for b in branches)
    assert branches[0].forced == (tags.branch_open, *_ids(tok, "1:"))
    assert all(set(b.stop_ids) == {tags.branch_close} and b.banned_ids == pol.end_ids for b in branches)
    # branch 1 answers first: nothing to do until branch 0 is done too
    assert ctl.advance(branches[1], _answer(branches[1], [50, tags.branch_close])) == []
    (merge,) = ctl.advance(branches[0], _answer(branches[0], [51, 52, 53, tags.branch_close]))
    assert merge.stream == MAIN and merge.after == 1 and merge.merge == (0, 1)
    assert merge.forced == tags.merge
    longest = len(branches[0].forced) + 4
    assert merge.position == g + longest + 1
    ctx = ctl.context_ids(merge)
    assert ctx == prompt + list(first.forced) + list(branches[0].forced) + [
        51,
        52,
        53,
        tags.branch_close,
    ] + list(branches[1].forced) + [50, tags.branch_close]
    assert merge.context_length == len(ctx)
    ctl.advance(merge, _answer(merge, [60, pol.end_ids[0]]))
    gen = ctl.generation("test", "reprefill")
    assert gen.blocks[0].merged and gen.blocks[0].branch_tokens == [longest, len(branches[1].forced) + 2]
    assert gen.position_ids[len(first.forced)] == g + 1 and gen.position_ids[-2] == g + longest + 1
    assert gen.merge_mode == "reprefill"
    # the ledger the post-merge rule is checked against (tests/integration/engine/test_backends.py): the
    # merged block ends right before the last two tokens (<takeaway> and 60), the ones sampled after the merge
    assert gen.blocks[0].start + sum(gen.blocks[0].branch_tokens) == len(gen.token_ids) - 2


def test_answers_in_any_order_give_the_same_generation(tok) -> None:
    def run(order: list[int]):
        pol = _policy(tok)
        ctl = SequenceController([1, 2], pol, seed=3, forced_prefix=_ids(tok, PLANS))
        _, branches = _fork(tok, ctl)
        seeds = [b.seed for b in branches]
        nxt = []
        for j in order:
            nxt += ctl.advance(branches[j], _answer(branches[j], [70 + j, pol.tags.branch_close]))
        return ctl, nxt, seeds

    a, na, sa = run([0, 1])
    b, nb, sb = run([1, 0])
    assert sa == sb and len(set(sa)) == 2  # per-branch seeds, not arrival order
    assert [e.forced for e in na] == [e.forced for e in nb] and na[0].seed == nb[0].seed
    assert a.context_ids(na[0]) == b.context_ids(nb[0])


def test_allowances_are_shared_again_when_a_branch_finishes_early(tok) -> None:
    seed_len = 1 + len(_ids(tok, "1:"))
    prefix = len(_ids(tok, PLANS))
    pol = _policy(tok, max_new_tokens=prefix + 2 * (seed_len + 4) + 1)
    ctl = SequenceController([1], pol, forced_prefix=_ids(tok, PLANS))
    _, (b0, b1) = _fork(tok, ctl)
    assert b0.max_sampled == b1.max_sampled == 4  # (remaining - takeaway) / 2 - seed
    close = pol.tags.branch_close
    assert ctl.advance(b1, _answer(b1, [80, close])) == []  # b1 leaves 2 tokens unspent
    (again,) = ctl.advance(b0, _answer(b0, [81, 82, 83, 84], "length"))  # b0 spent its allowance
    assert again.stream == 0 and again.after == 0 and again.forced == () and again.max_sampled == 2
    (merge,) = ctl.advance(again, _answer(again, [85, close]))
    assert merge.is_merge and ctl.ledger.remaining == 1


def test_a_banned_end_of_turn_is_drawn_again_then_ends_the_response(tok) -> None:
    pol = _policy(tok)
    eot = pol.end_ids[0]
    ctl = SequenceController([1], pol, forced_prefix=_ids(tok, PLANS))
    _, (b0, b1) = _fork(tok, ctl)
    ctl.advance(b1, _answer(b1, [90, pol.tags.branch_close]))
    ext = b0
    for k in range(MAX_BANNED_REDRAWS):
        (nxt,) = ctl.advance(ext, _answer(ext, [91 + k, eot]))
        assert nxt.stream == 0 and nxt.forced == () and nxt.seed != ext.seed
        ext = nxt
    assert ctl.advance(ext, _answer(ext, [eot])) == []
    gen = ctl.generation("test", "reprefill")
    assert gen.finish_reason == "stop" and gen.stop_token_id == eot and eot not in gen.token_ids
    assert not gen.blocks[0].merged
    assert gen.blocks[0].branch_tokens[0] == len(b0.forced) + MAX_BANNED_REDRAWS  # the redrawn tokens kept


def test_refusal_and_answers_that_break_the_request(tok) -> None:
    pol = _policy(tok, max_branches=1)
    ctl = SequenceController([1], pol, forced_prefix=_ids(tok, PLANS))
    first, follow = _fork(tok, ctl)
    assert ctl.refusals == ["2 plans > max_branches 1"] and follow[0].stream == MAIN
    ext = follow[0]
    with pytest.raises(ControllerError, match="at most"):
        ctl.advance(ext, _answer(ext, [5] * (ext.max_sampled + 1), "length"))
    with pytest.raises(ControllerError, match="without a stop"):
        ctl.advance(ext, _answer(ext, [5], "length"))


def test_unscored_forced_tokens_stay_nan(tok) -> None:
    pol = _policy(tok, mode="sequential", tags=None)
    ctl = SequenceController([1], pol, forced_prefix=[7, 8])
    (ext,) = ctl.start()
    ids = [7, 8, pol.end_ids[0]]
    ctl.advance(ext, ExtensionResult(ids, [math.nan, math.nan, -0.5], "stop"))
    gen = ctl.generation("async", "reprefill")
    assert gen.forced == [True, True] and all(math.isnan(x) for x in gen.logprobs)


def test_a_fixed_branch_rule_with_a_sampled_merge_needs_no_code(tok) -> None:
    """What a Parallel-R1-shaped ForkRule gives (issue #20 adds the schema's data): a trigger tag forks a
    fixed number of unlabelled branches; after them the main stream samples the merge tag itself."""
    from components.engine.parallel import ForkTags

    trigger, path_open, path_close = 900, 901, 902
    fork = ForkTags(
        schema_name="fixed", trigger=trigger, branch_open=path_open, branch_close=path_close, merge=(),
        fixed_branches=2,
    )  # fmt: skip
    pol = _policy(tok, tags=fork)
    ctl = SequenceController([1, 2], pol, forced_prefix=[trigger])
    (first,) = ctl.start()
    b0, b1 = ctl.advance(first, _answer(first, [], "length"))
    assert b0.forced == b1.forced == (path_open,) and b0.position == b1.position == 3
    ctl.advance(b0, _answer(b0, [10, 11, path_close]))
    (merge,) = ctl.advance(b1, _answer(b1, [12, path_close]))
    assert merge.forced == () and merge.after == 1 and merge.max_sampled > 0 and merge.position == 2 + 4 + 1
    ctl.advance(merge, _answer(merge, [903, pol.end_ids[0]]))
    gen = ctl.generation("test", "shared_kv")
    assert gen.blocks[0].labels == ["", ""] and gen.blocks[0].merged and gen.token_ids[-1] == 903
