"""Mask and position ids: the §1.8 worked example exactly, nesting, other schemas, batching, errors."""

from __future__ import annotations

import pytest
import torch

from components.structure import (
    MULTIVERSE,
    NPR,
    PARALLEL_R1,
    StructureError,
    TagIds,
    TagTokenError,
    batch_parallel_attention_inputs,
    batch_parallel_segments,
    parallel_attention_inputs,
    parallel_segments,
    to_additive_mask,
)


def words(text: str) -> list[str]:
    return text.split()


def _ids(tokens: list[str], tags: TagIds) -> list[int]:
    """Tag names become their ids; any other word becomes a small text id (its index in a word list)."""
    words: dict[str, int] = {}
    return [tags.ids[t] if t in tags.ids else words.setdefault(t, len(words) + 1) for t in tokens]


def _causal(n: int) -> torch.Tensor:
    return torch.ones(n, n, dtype=torch.bool).tril()


# npr-reference.md §1.8, token for token (U = user turn, A = assistant header).
WORKED = words(
    "U <|im_end|> A <guideline> <plan> p1 </plan> <plan> p2 </plan> </guideline> \\n <step> a a </step> \\n "
    "<step> b b b b </step> \\n <takeaway> t </takeaway> x"
)
WORKED_POS = [
    0,
    1,
    2,
    3,
    4,
    5,
    6,
    7,
    8,
    9,
    10,
    11,
    11,
    12,
    13,
    14,
    15,
    11,
    12,
    13,
    14,
    15,
    16,
    17,
    17,
    18,
    19,
    20,
]


def test_worked_example_positions_and_mask(npr_tags: TagIds) -> None:
    ids = _ids(WORKED, npr_tags)
    mask, pos = parallel_attention_inputs(ids, npr_tags, start=2)  # scan starts after <|im_end|>
    assert pos.dtype == torch.long and pos.tolist() == WORKED_POS
    expected = _causal(len(ids))
    step1 = slice(WORKED.index("<step>"), WORKED.index("</step>") + 1)  # 12..15
    step2 = slice(17, 23)
    assert (
        (step1.start, step1.stop) == (12, 16) and WORKED[step2.start] == "<step>" and WORKED[22] == "</step>"
    )
    expected[step2, step1] = False  # step 2 cannot see step 1 (the reverse is already causal)
    assert mask.dtype == torch.bool and torch.equal(mask, expected)
    # Separators between steps are outside spans: step 2 sees the \n after step 1; the takeaway sees all.
    assert mask[17, 16] and mask[24, 12:23].all()


def test_canonical_layout_positions(npr_tags: TagIds) -> None:
    toks = words(
        "Q <guideline> <plan> p </plan> <plan> p </plan> <plan> p </plan> </guideline> <step> a </step> <step> b b b </step> <step> c c </step> <takeaway> t </takeaway> x"
    )
    _, pos = parallel_attention_inputs(_ids(toks, npr_tags), npr_tags)
    g = toks.index("</guideline>")
    assert g == 11  # G; every step starts at 12, the takeaway at 11 + 5 (longest span) + 1
    assert pos.tolist() == list(range(12)) + [12, 13, 14] + [12, 13, 14, 15, 16] + [12, 13, 14, 15] + [
        17,
        18,
        19,
        20,
    ]


def test_sequential_sequence_is_causal_arange(npr_tags: TagIds) -> None:
    ids = list(range(1, 40))
    mask, pos = parallel_attention_inputs(ids, npr_tags)
    assert torch.equal(mask, _causal(39)) and pos.tolist() == list(range(39))
    mask_t, pos_t = parallel_attention_inputs(torch.tensor(ids), npr_tags)
    assert torch.equal(mask_t, mask) and torch.equal(pos_t, pos)


def test_prompt_tags_are_ignored(npr_tags: TagIds) -> None:
    prompt = _ids(words("say <step> and </step> please"), npr_tags)
    with pytest.raises(StructureError):
        parallel_attention_inputs(prompt, npr_tags)
    mask, pos = parallel_attention_inputs(prompt + [1, 2], npr_tags, start=len(prompt))
    assert torch.equal(mask, _causal(7)) and pos.tolist() == list(range(7))


@pytest.mark.parametrize(
    ("tokens", "code", "position"),
    [
        ("a <step> b </step>", "tag_in_tail", 1),
        ("a </step>", "tag_in_tail", 1),
        ("<guideline> <plan> p </plan> </guideline> <step> a", "unclosed_block", 0),
        (
            "<guideline> <plan> p </plan> </guideline> <step> a <step> b </step> <takeaway> t </takeaway>",
            "misplaced_tag",
            7,
        ),
        (
            "<guideline> <plan> p </plan> </guideline> <step> <guideline> </step> <takeaway> t </takeaway>",
            "nested_block",
            6,
        ),
        (
            "</plan> <guideline> <plan> p </plan> </guideline> <step> a </step> <takeaway> t </takeaway>",
            "tag_outside_block",
            0,
        ),
    ],
)
def test_malformed_raises_typed_error(npr_tags: TagIds, tokens: str, code: str, position: int) -> None:
    with pytest.raises(StructureError) as err:
        parallel_attention_inputs(_ids(tokens.split(), npr_tags), npr_tags)
    assert isinstance(err.value, ValueError)
    assert (err.value.code, err.value.position) == (code, position)
    assert err.value.reason


def test_content_violations_do_not_block_the_mask(npr_tags: TagIds) -> None:
    # One plan, two steps, no labels, no answer: a bad format score but a well-formed tag structure.
    toks = words(
        "<guideline> <plan> p </plan> </guideline> <step> a </step> <step> b </step> <takeaway> t </takeaway>"
    )
    mask, pos = parallel_attention_inputs(_ids(toks, npr_tags), npr_tags)
    assert pos.tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 5, 6, 7, 8, 9, 10]
    assert not mask[8:11, 5:8].any()


# Multiverse with a block nested in the first path (positions derived by hand from the rule).
NESTED = words(
    "Q <Parallel> <Goal> <Outline> o </Outline> <Outline> o </Outline> </Goal> "
    "<Path> a <Parallel> <Goal> <Outline> o </Outline> </Goal> <Path> c </Path> <Path> d d </Path> "
    "<Conclusion> e </Conclusion> </Parallel> f </Path> <Path> g </Path> <Conclusion> h </Conclusion> </Parallel> z"
)
NESTED_POS = (
    list(range(10))  # Q .. </Goal> (G = 9)
    + [10, 11, 12, 13, 14, 15, 16, 17]  # <Path> a <Parallel> <Goal> <Outline> o </Outline> </Goal> (G' = 17)
    + [18, 19, 20]  # <Path> c </Path>          -> 20 - 17 = 3
    + [18, 19, 20, 21]  # <Path> d d </Path>    -> 21 - 17 = 4
    + [22, 23, 24, 25, 26, 27]  # <Conclusion> at 17 + 4 + 1; ... f </Path> -> 27 - 9 = 18
    + [10, 11, 12]  # <Path> g </Path>
    + [28, 29, 30, 31, 32]  # <Conclusion> at 9 + 18 + 1
)


def test_multiverse_nested_positions_and_mask(make_tags) -> None:  # noqa: ANN001
    tags = make_tags(MULTIVERSE)
    mask, pos = parallel_attention_inputs(_ids(NESTED, tags), tags)
    assert pos.tolist() == NESTED_POS
    expected = _causal(len(NESTED))
    expected[31:34, 10:31] = False  # outer path 2 vs outer path 1 (which holds the nested block)
    expected[21:25, 18:21] = False  # inner path 2 vs inner path 1
    assert torch.equal(mask, expected)
    segs = parallel_segments(_ids(NESTED, tags), tags)
    assert segs.block_ids.shape == (1, 2, len(NESTED))  # two nesting depths, O(L) each


def test_parallel_r1_positions(make_tags) -> None:  # noqa: ANN001
    tags = make_tags(PARALLEL_R1)
    toks = words("Q <Parallel> <Path> a </Path> <Path> b b </Path> </Parallel> <Summary> s </Summary> x")
    mask, pos = parallel_attention_inputs(_ids(toks, tags), tags)
    assert pos.tolist() == [0, 1, 2, 3, 4, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    expected = _causal(len(toks))
    expected[5:9, 2:5] = False
    assert torch.equal(mask, expected)


def test_batch_right_pads_and_matches_single(npr_tags: TagIds) -> None:
    a = _ids(WORKED, npr_tags)
    b = _ids(
        words("Q R <guideline> <plan> p </plan> </guideline> <step> s s </step> <takeaway> t </takeaway>"),
        npr_tags,
    )
    mask, pos = batch_parallel_attention_inputs([a, b], npr_tags, starts=[2, 1], pad_to=32)
    assert mask.shape == (2, 1, 32, 32) and mask.dtype == torch.bool and pos.shape == (2, 32)
    for row, (ids, start) in enumerate([(a, 2), (b, 1)]):
        m1, p1 = parallel_attention_inputs(ids, npr_tags, start)
        n = len(ids)
        assert torch.equal(mask[row, 0, :n, :n], m1) and torch.equal(pos[row, :n], p1)
        assert not mask[row, 0, :n, n:].any()  # real tokens never see padding
        assert torch.equal(mask[row, 0, n:], torch.eye(32, dtype=torch.bool)[n:])  # pads: themselves only
        assert (pos[row, n:] == 0).all()
    with pytest.raises(ValueError, match="pad_to"):
        batch_parallel_attention_inputs([a, b], npr_tags, starts=[2, 1], pad_to=10)


def test_dense_mask_equals_the_segment_definition(make_tags) -> None:  # noqa: ANN001
    """Dense mask == causal AND NOT (same block id, different step index at some depth), pads aside."""
    tags = make_tags(MULTIVERSE)
    segs = batch_parallel_segments([_ids(NESTED, tags), [5, 6, 7]], tags)
    dense = segs.dense_mask()[:, 0]
    length = segs.shape[1]
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    for b in range(2):
        n = int(segs.lengths[b])
        bq, bk = segs.block_ids[b][:, :, None], segs.block_ids[b][:, None, :]
        sq, sk = segs.step_ids[b][:, :, None], segs.step_ids[b][:, None, :]
        sibling = ((bq == bk) & (sq != sk) & (bq >= 0)).any(0)
        assert torch.equal(dense[b, :n, :n], (causal & ~sibling)[:n, :n])


def test_additive_mask_uses_finfo_min_never_inf() -> None:
    mask = torch.tensor([[True, False], [True, True]])
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        add = to_additive_mask(mask, dtype)
        assert add.dtype == dtype
        assert add[0, 0] == 0 and add[1, 0] == 0 and add[1, 1] == 0
        assert add[0, 1] == torch.finfo(dtype).min and torch.isfinite(add).all()
    with pytest.raises(TypeError):
        to_additive_mask(mask.float())
    with pytest.raises(TypeError):
        to_additive_mask(mask, torch.int64)


def test_tag_ids_from_tokenizer() -> None:
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    from transformers import PreTrainedTokenizerFast

    vocab = {"[UNK]": 0, "<": 1, ">": 2, "/": 3, "a": 4}
    raw = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    raw.pre_tokenizer = Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="[UNK]")
    with pytest.raises(TagTokenError) as err:
        TagIds.from_tokenizer(tok, "npr")
    assert err.value.tag == "<guideline>" and len(err.value.pieces) > 1
    tok.add_special_tokens({"additional_special_tokens": list(NPR.tags)})
    tags = TagIds.from_tokenizer(tok, "npr")
    assert sorted(tags.ids.values()) == list(range(5, 13))
    assert tags.decode is not None and tags.decode([4]) == "a"
    ids = tok.encode(
        "<guideline><plan>a</plan></guideline><step>a</step><takeaway>a</takeaway>", add_special_tokens=False
    )
    _, pos = parallel_attention_inputs(ids, tags)
    assert pos.tolist() == list(range(len(ids)))  # one step: nothing to re-base


def test_tag_ids_validation() -> None:
    with pytest.raises(ValueError, match="lacks"):
        TagIds(NPR, {"<step>": 1})
    with pytest.raises(ValueError, match="share"):
        TagIds(NPR, dict.fromkeys(NPR.tags, 3))


def test_tag_ids_hash_ignores_decoder() -> None:
    ids = {t: 50 + i for i, t in enumerate(NPR.tags)}
    assert hash(TagIds(NPR, ids)) == hash(TagIds(NPR, dict(ids), decode=lambda x: "")) and TagIds(
        NPR, ids
    ) == TagIds(NPR, ids, decode=str)
