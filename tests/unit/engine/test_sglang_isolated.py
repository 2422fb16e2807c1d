"""The SGLang isolated-merge plugin (EXPERIMENTAL), everything but the kernels: what it would install equals
``components.structure.parallel_attention_inputs`` for the same tokens, the radix cut is the fork point,
it is off by default, and its entry point is declared. sglang is never imported (a stand-in registry and
stand-in batches take its place); tests/unit/engine/test_sglang_hook_targets.py checks the hook targets
against the pinned wheel's source.
"""

from __future__ import annotations

import dataclasses
import pkgutil
import sys
import tomllib
import types
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from components.engine.backends import sglang_isolated as iso
from components.engine.backends import sglang_plugin as plugin
from components.structure import NPR, TagIds, parallel_attention_inputs

ROOT = Path(__file__).resolve().parents[3]
TAG_IDS = {tag: 100 + i for i, tag in enumerate(NPR.tags)}
TAGS = TagIds(NPR, TAG_IDS)
G, GC, P, PC, S, SC, K, KC = (
    TAG_IDS[t]
    for t in (
        "<guideline>",
        "</guideline>",
        "<plan>",
        "</plan>",
        "<step>",
        "</step>",
        "<takeaway>",
        "</takeaway>",
    )
)
PROMPT = [1, 2, 3, S, 4, SC]  # tags in the prompt are ignored (start = len(PROMPT))


def block(branch_lens: list[int], seed: int) -> list[int]:
    """One NPR block: a guideline with one plan per branch, branches of the given content lengths, a takeaway."""
    out = [G]
    for k in range(len(branch_lens)):
        out += [P, 10 + k, PC]
    out.append(GC)
    for k, n in enumerate(branch_lens):
        out += [S] + [20 + (seed + k + j) % 30 for j in range(n)] + [SC]
    return out + [K, 60 + seed, 61, KC]


def trace(blocks: list[list[int]]) -> list[int]:
    """prompt + response: text, then each block followed by a little text."""
    ids = list(PROMPT) + [70, 71]
    for b, lens in enumerate(blocks):
        ids += block(lens, b) + [72 + b]
    return ids


TRACES = [
    [[3, 5]],
    [[4, 2, 6]],
    [[2, 3, 4, 5]],
    [[3, 1], [2, 5, 4]],
    [[1, 4, 2], [5, 1], [2, 2, 2, 2]],
]


def merge_points(ids: list[int]) -> list[int]:
    """Lengths of the merge requests of a trace: prefix + every branch + <takeaway>."""
    return [i + 1 for i, t in enumerate(ids) if t == K]


def fork_of(ids: list[int], merge_len: int) -> int:
    """Index of the first <step> of the block a merge request closes."""
    anchor = max(i for i in range(merge_len) if ids[i] == GC)
    assert ids[anchor + 1] == S
    return anchor + 1


def test_pinned_example():
    """A two-branch block after a two-token prompt: numbers written out by hand from the rule."""
    tags = TagIds(NPR, TAG_IDS)
    #      0  1  2  3  4   5  6   7   8  9 10  11 12  13 14 15  16 17
    ids = [1, 2, G, P, 10, PC, GC, S, 20, 21, SC, S, 22, SC, K, 60]
    inputs = iso.canonical_inputs(ids[:15], tags, 2)
    assert inputs is not None and inputs.suffix == (KC,)
    # steps restart at anchor(6) + 1 = 7; the takeaway sits at 6 + maxlen(4) + 1 = 11
    assert inputs.positions.tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 7, 8, 9, 11]
    assert inputs.offset == 14 - 11
    assert torch.nonzero(inputs.masked_rows).flatten().tolist() == [11, 12, 13]  # the second branch
    assert [inputs.position(j) for j in (15, 16)] == [12, 13]
    assert inputs.cut_point(14) == 14  # both branches cached (by an identical merge): only <takeaway> left
    for matched in (8, 10, 11, 12, 13):  # inside or after the first branch: back to the fork point
        assert inputs.cut_point(matched) == 7
    assert [inputs.cut_point(m) for m in (0, 3, 7)] == [0, 3, 7]


@pytest.mark.parametrize("blocks", TRACES, ids=lambda b: "-".join(str(len(x)) for x in b))
def test_every_prefix_gets_the_trainers_inputs(blocks):
    """Any request (the trace cut anywhere in its response, open tail closed by the plugin) gets exactly
    the full trace's positions and mask for its tokens."""
    ids = trace(blocks)
    mask, positions = parallel_attention_inputs(ids, TAGS, len(PROMPT))
    for length in range(len(PROMPT), len(ids) + 1):
        inputs = iso.canonical_inputs(ids[:length], TAGS, len(PROMPT))
        assert inputs is not None, length
        assert torch.equal(inputs.positions, positions[:length]), length
        assert torch.equal(inputs.mask_rows(0, length), mask[:length, :length]), length


@pytest.mark.parametrize("blocks", TRACES, ids=lambda b: "-".join(str(len(x)) for x in b))
def test_merge_requests_extend_decode_and_cut(blocks):
    ids = trace(blocks)
    mask, positions = parallel_attention_inputs(ids, TAGS, len(PROMPT))
    for b, length in enumerate(merge_points(ids)):
        inputs = iso.canonical_inputs(ids[:length], TAGS, len(PROMPT))
        fork = fork_of(ids, length)
        first_branch_end = ids.index(SC, fork) + 1
        # the radix holds prefix + first branch: the match is cut back to the fork point
        assert inputs.cut_point(first_branch_end) == fork
        assert inputs.cut_point(fork) == fork
        assert inputs.cut_point(length - 1) == length - 1
        # the extend after the cut: canonical positions and mask rows over prefix + extend
        extend = length - fork
        assert torch.equal(inputs.extend_positions(fork, extend), positions[fork:length])
        rows = inputs.mask_rows(fork, extend)
        assert rows.shape == (extend, length)
        assert torch.equal(rows, mask[fork:length, :length])
        assert not inputs.rows_are_causal(fork, extend)
        assert rows[:, :fork].all()  # every extended row sees the whole cut prefix (kernel default is safe)
        # decoding on: flat index - offset is the trainer's position through the next block's first step
        nxt = ids.index(GC, length) + 1 if b + 1 < len(blocks) else len(ids) - 1
        end = ids.index(SC, nxt) + 1 if b + 1 < len(blocks) else len(ids)
        decoded = torch.tensor([j - inputs.offset for j in range(length, end)])
        assert torch.equal(decoded, positions[length:end])
        assert torch.equal(inputs.extend_positions(length, end - length), positions[length:end])
        # a re-prefill that includes decoded tokens (a retracted request): their rows are the trainer's too
        assert torch.equal(inputs.mask_rows(fork, end - fork), mask[fork:end, :end])
        # a merge of k branches of lengths n_i: offset = sum(n_i + 2) - (max n_i + 2)
        lens = blocks[b]
        assert inputs.offset - (iso.canonical_inputs(ids[:fork], TAGS, len(PROMPT)).offset) == sum(
            n + 2 for n in lens
        ) - (max(lens) + 2)


def test_branch_requests_keep_any_match_and_are_causal():
    ids = trace([[3, 4], [2, 6, 1]])
    second = merge_points(ids)[0]
    fork = ids.index(GC, second) + 1
    # branch 1 of the second block: prefix (with the first block closed) + <step> + two tokens
    length = fork + 3
    inputs = iso.canonical_inputs(ids[:length], TAGS, len(PROMPT))
    assert inputs.suffix == (SC, K, KC)
    # any match from the first block's <takeaway> on is usable; one inside its branches is cut to its fork
    assert all(inputs.cut_point(m) == m for m in range(second - 1, length))
    first_fork = fork_of(ids, second)
    assert inputs.cut_point(second - 2) == first_fork
    assert inputs.rows_are_causal(fork, 3)
    mask, positions = parallel_attention_inputs(ids, TAGS, len(PROMPT))
    assert torch.equal(inputs.extend_positions(fork, 3), positions[fork:length])
    # re-prefilled from scratch, the first block's branches are still blind to each other
    assert not inputs.rows_are_causal(0, length)
    assert torch.equal(inputs.mask_rows(0, length), mask[:length, :length])


def test_malformed_tags_are_left_alone():
    ids = list(PROMPT) + [G, GC, S, 5, SC, SC, 6]  # a stray </step>
    assert iso.closing_suffix(ids, TAGS, len(PROMPT)) is None
    assert iso.canonical_inputs(ids, TAGS, len(PROMPT)) is None
    assert iso.closing_suffix(PROMPT, TAGS, len(PROMPT)) == []  # no response yet


def test_request_fields_round_trip_and_namespace():
    fields = iso.request_fields(7, TAGS)
    assert fields["extra_key"] == "npr-isolated:7"
    start, tags = iso.parse_request_params(fields["custom_params"])
    assert start == 7 and tags == TAGS
    assert iso.parse_request_params(None) is None
    assert iso.parse_request_params({"thinking_budget": 3}) is None
    with pytest.raises(ValueError):
        iso.parse_request_params({iso.PARAM: {"response_start": -1, "tags": TAG_IDS}})
    assert iso.namespace_key(7) != iso.namespace_key(8)
    assert iso.namespace_key(7, "salt") == "npr-isolated:7|salt"
    assert iso.namespace_key(7, iso.namespace_key(7, "salt")) == "npr-isolated:7|salt"


def test_batch_custom_mask_layout():
    a = torch.tensor([[True, False, True], [True, True, True]])
    b = torch.ones(1, 4, dtype=torch.bool)
    flat, indptr = iso.batch_custom_mask([a, b])
    assert indptr.tolist() == [0, 6, 10] and indptr.dtype == torch.int64
    assert flat.tolist() == [True, False, True, True, True, True, True, True, True, True]


# -- the plugin: off by default, its hooks on stand-in sglang objects -------------------------------------


@pytest.fixture
def fake_registry(monkeypatch):
    """A stand-in ``sglang.srt.plugins.hook_registry`` recording what is registered."""
    registered: list[tuple[str, object, str]] = []

    class HookType:
        BEFORE, AFTER, AROUND, REPLACE = "before", "after", "around", "replace"

        def __class_getitem__(cls, name):
            return getattr(cls, name)

    class HookRegistry:
        @classmethod
        def register(cls, target, hook, hook_type="after"):
            registered.append((target, hook, hook_type))

        @classmethod
        def apply_hooks(cls):  # the real registry's is driven in test_sglang_hook_targets.py
            pass

    module = types.ModuleType("sglang.srt.plugins.hook_registry")
    module.HookRegistry, module.HookType = HookRegistry, HookType
    for name in ("sglang", "sglang.srt", "sglang.srt.plugins"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "sglang.srt.plugins.hook_registry", module)
    return registered


@pytest.mark.parametrize("value", [None, "", "0", "true"])
def test_off_unless_the_flag_is_one(monkeypatch, fake_registry, value):
    if value is None:
        monkeypatch.delenv(iso.ENV_FLAG, raising=False)
    else:
        monkeypatch.setenv(iso.ENV_FLAG, value)
    plugin.register()
    assert fake_registry == []


def test_off_imports_no_sglang(monkeypatch):
    monkeypatch.delenv(iso.ENV_FLAG, raising=False)
    monkeypatch.setitem(sys.modules, "sglang", None)  # any import of sglang would raise
    plugin.register()


def test_on_registers_the_three_hooks(monkeypatch, fake_registry):
    monkeypatch.setenv(iso.ENV_FLAG, "1")
    plugin.register()
    assert [(t, k) for t, _, k in fake_registry] == [
        ("sglang.srt.mem_cache.radix_cache.RadixCache.match_prefix", "around"),
        ("sglang.srt.model_executor.forward_batch_info.ForwardBatch.init_new", "after"),
        ("sglang.srt.layers.attention.triton_backend.TritonAttnBackend.init_forward_metadata", "after"),
    ]


def test_entry_point_is_declared_and_resolves():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    value = project["entry-points"]["sglang.srt.plugins"]["npr_isolated_merge"]
    assert value == "components.engine.backends.sglang_plugin:register"
    assert pkgutil.resolve_name(value) is plugin.register


class _Key:
    """A stand-in RadixKey: token ids and a namespace, sliceable."""

    def __init__(self, token_ids, extra_key=None):
        self.token_ids, self.extra_key = list(token_ids), extra_key

    def __len__(self):
        return len(self.token_ids)

    def __getitem__(self, s):
        return _Key(self.token_ids[s], self.extra_key)


@dataclasses.dataclass
class _Params:
    key: _Key
    req: object = None


class _Cache:
    """A stand-in radix cache holding one cached sequence per namespace; records every match."""

    def __init__(self, cached: dict[str | None, list[int]]):
        self.cached, self.calls = cached, []

    def match(self, cache, params):
        self.calls.append((list(params.key.token_ids), params.key.extra_key))
        held = self.cached.get(params.key.extra_key, [])
        n = 0
        while n < min(len(held), len(params.key)) and held[n] == params.key.token_ids[n]:
            n += 1
        return SimpleNamespace(device_indices=torch.arange(n))


def _req(ids, start=None, extra_key=None, output=()):
    custom = iso.request_fields(start, TAGS)["custom_params"] if start is not None else None
    return SimpleNamespace(
        rid="r", origin_input_ids=list(ids), output_ids=list(output), extra_key=extra_key,
        sampling_params=SimpleNamespace(custom_params=custom),
    )  # fmt: skip


def test_match_prefix_cuts_a_merge_to_the_fork_point():
    ids = trace([[3, 5, 2]])
    length = merge_points(ids)[0]
    fork = fork_of(ids, length)
    ns = iso.namespace_key(len(PROMPT))
    # the namespace holds prefix + the first branch (its branch request ran there)
    cache = _Cache({ns: ids[: ids.index(SC, fork) + 1], None: ids})
    req = _req(ids[:length], start=len(PROMPT))
    result = plugin.around_match_prefix(cache.match, "cache", _Params(_Key(ids[: length - 1]), req))
    assert len(result.device_indices) == fork
    assert req.extra_key == ns and all(key == ns for _, key in cache.calls)  # never the stock KV
    assert [len(t) for t, _ in cache.calls] == [length - 1, fork]
    inputs = getattr(req, plugin.REQ_ATTR)
    assert inputs.length == length and inputs.suffix == (KC,)


def test_a_malformed_request_is_served_stock_outside_the_namespace():
    ids = list(PROMPT) + [G, GC, S, 5, SC, S, 6, SC, K, 7, KC, SC, 8]  # a stray </step> after the block
    ns = iso.namespace_key(len(PROMPT))
    cache = _Cache({ns: ids})
    req = _req(ids, start=len(PROMPT), extra_key=ns)  # as the client sends it
    result = plugin.around_match_prefix(cache.match, "cache", _Params(_Key(ids[:-1], ns), req))
    assert getattr(req, plugin.REQ_ATTR) is None and len(result.device_indices) == 0
    assert req.extra_key == ns + iso.MALFORMED and cache.calls == [(ids[:-1], ns + iso.MALFORMED)]
    # matched again (a retraction), it stays there
    plugin.around_match_prefix(cache.match, "cache", _Params(_Key(ids[:-1], req.extra_key), req))
    assert req.extra_key == ns + iso.MALFORMED


def test_match_prefix_leaves_unmarked_requests_alone():
    ids = trace([[3, 5]])
    cache = _Cache({None: ids})
    req = _req(ids[:20])
    params = _Params(_Key(ids[:19]), req)
    result = plugin.around_match_prefix(cache.match, "cache", params)
    assert len(result.device_indices) == 19 and cache.calls == [(ids[:19], None)]
    assert req.extra_key is None and not hasattr(req, plugin.REQ_ATTR)
    no_req = plugin.around_match_prefix(cache.match, "cache", _Params(_Key(ids[:5])))
    assert len(no_req.device_indices) == 5


class _Mode:
    def __init__(self, name):
        self.name = name

    def is_decode(self):
        return self.name == "DECODE"


def _marked_req(ids, length):
    req = _req(ids[:length], start=len(PROMPT))
    setattr(req, plugin.REQ_ATTR, iso.canonical_inputs(ids[:length], TAGS, len(PROMPT)))
    return req


def test_init_new_writes_extend_positions_and_mask_rows():
    ids = trace([[2, 4], [3, 3, 1]])
    mask, positions = parallel_attention_inputs(ids, TAGS, len(PROMPT))
    length = merge_points(ids)[1]
    fork = fork_of(ids, length)
    merge = _marked_req(ids, length)
    stock = _req([5, 6, 7, 8])
    batch = SimpleNamespace(
        reqs=[stock, merge], extend_prefix_lens=[1, fork], extend_seq_lens=[3, length - fork]
    )
    fb = SimpleNamespace(
        forward_mode=_Mode("EXTEND"), positions=torch.zeros(3 + length - fork, dtype=torch.int32)
    )
    plugin.after_init_new(fb, "cls", batch, "runner")
    assert fb.positions.dtype == torch.int32
    assert fb.positions.tolist() == [1, 2, 3] + positions[fork:length].tolist()
    flat, indptr = getattr(fb, plugin.BATCH_ATTR)
    assert indptr.tolist() == [0, 3 * 4, 3 * 4 + (length - fork) * length]
    assert torch.equal(flat[:12].view(3, 4), torch.ones(3, 4, dtype=torch.bool).tril(1))
    assert torch.equal(flat[12:].view(length - fork, length), mask[fork:length, :length])


def test_init_new_decode_subtracts_the_offset_and_causal_extends_get_no_mask():
    ids = trace([[2, 4]])
    _, positions = parallel_attention_inputs(ids, TAGS, len(PROMPT))
    length = merge_points(ids)[0]
    merge, stock = _marked_req(ids, length), _req([1, 2, 3])
    seq_lens = [length + 2, 9]  # two tokens decoded after <takeaway>; the stock request at 9
    fb = SimpleNamespace(forward_mode=_Mode("DECODE"), positions=torch.tensor([s - 1 for s in seq_lens]))
    plugin.after_init_new(fb, "cls", SimpleNamespace(reqs=[merge, stock]), "runner")
    assert fb.positions.tolist() == [int(positions[length + 1]), 8]
    # a causal extend (the request's own decoded tokens re-read) installs positions but no mask
    batch = SimpleNamespace(reqs=[merge], extend_prefix_lens=[length], extend_seq_lens=[2])
    fb = SimpleNamespace(forward_mode=_Mode("EXTEND"), positions=torch.zeros(2, dtype=torch.long))
    plugin.after_init_new(fb, "cls", batch, "runner")
    assert fb.positions.tolist() == positions[length : length + 2].tolist()
    assert not hasattr(fb, plugin.BATCH_ATTR)


def test_init_new_leaves_unmarked_batches_alone():
    fb = SimpleNamespace(forward_mode=_Mode("DECODE"), positions=torch.tensor([4, 9]))
    plugin.after_init_new(fb, "cls", SimpleNamespace(reqs=[_req([1]), _req([2])]), "runner")
    assert fb.positions.tolist() == [4, 9]


def test_init_forward_metadata_installs_the_mask_and_unskips_the_prefix():
    calls = []

    def kernel(*args, **kwargs):
        calls.append(kwargs.get("skip_prefix_custom_mask", "default"))

    backend = SimpleNamespace(forward_metadata=SimpleNamespace(custom_mask=None, mask_indptr=None))
    backend.extend_attention_fwd = kernel
    stash = (torch.ones(4, dtype=torch.bool), torch.tensor([0, 4]))
    fb = SimpleNamespace(forward_mode=_Mode("EXTEND"))
    setattr(fb, plugin.BATCH_ATTR, stash)
    plugin.after_init_forward_metadata(None, backend, fb)
    assert (
        backend.forward_metadata.custom_mask is stash[0] and backend.forward_metadata.mask_indptr is stash[1]
    )
    backend.extend_attention_fwd("q", logit_cap=0.0)
    # the next batch builds fresh metadata without a plugin mask: the kernel's own default again
    backend.forward_metadata = SimpleNamespace(custom_mask=None, mask_indptr=None)
    plugin.after_init_forward_metadata(None, backend, SimpleNamespace(forward_mode=_Mode("EXTEND")))
    backend.extend_attention_fwd("q")
    assert calls == [False, "default"]


def test_the_cut_table_does_not_depend_on_the_row_block_size(monkeypatch):
    ids = trace([[1, 4, 2], [5, 1], [2, 2, 2, 2]])
    length = merge_points(ids)[2]
    whole = iso.canonical_inputs(ids[:length], TAGS, len(PROMPT))
    monkeypatch.setattr(iso, "_ROWS", 3)
    blocks = iso.canonical_inputs(ids[:length], TAGS, len(PROMPT))
    assert torch.equal(whole.cut_table, blocks.cut_table)
    assert torch.equal(whole.masked_rows, blocks.masked_rows)
    # and the table against its definition: p is usable iff mask[p:, :p] is all True
    mask, _ = parallel_attention_inputs(ids[:length] + [KC], TAGS, len(PROMPT))
    mask = mask[:length, :length]
    assert whole.cut_table.tolist() == [bool(mask[p:, :p].all()) for p in range(length + 1)]
