"""One set of invariants, every token backend: the fork/merge controller's decisions hold whatever decodes.

Backends (``BACKENDS``): the torch engine in both merge modes; SGLang's native HTTP API, served by the
protocol-faithful stand-in server (tests/support/sglang_standin.py) started as a real subprocess through
``components.engine.serving``; and the async driver over an in-process ``async generate`` (the shape
of verl's agent-loop ``server_manager.generate``). Invariants: structure and canonical layout, canonical
positions, branch-token log-probs equal to the trainer's teacher forcing under
``parallel_attention_inputs`` (<= 1e-4; every token for ``shared_kv``, and for ``reprefill`` the
post-merge tokens equal a sequential re-read of the flat text), every token equal to the trainer's teacher
forcing under the merge semantics the backend samples exactly (``components.structure.merge``: ``isolated``
for the shared-KV merge, ``reread`` for every re-prefilling backend), refusals with reasons, budgets. No
repetition penalty inside steps here: SGLang returns the log-probs of the penalised distribution, the torch
engine those of the model's own.

Cases are data (``CASES``): a schema, a forced block prefix, what the fork must produce. NPR's fork at
``</guideline>`` into one labelled branch per plan; Parallel-R1's (issue #20) at ``<Parallel>`` into a
configured number of unlabelled paths, each closed by ``</Path>``, with ``</Parallel><Summary>`` forced into
the main stream after them. The world's tokenizer holds both schemas' tags as single tokens.
"""

from __future__ import annotations

import asyncio
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import yaml

from components.engine import GenerationConfig, generate
from components.engine.async_driver import generate_async
from components.engine.backends.torch_tokens import TorchTokenGenerator
from components.engine.controller import end_of_turn_ids
from components.engine.ledger import TokenLedger
from components.engine.serving import launched
from components.models.tags import add_tag_tokens
from components.models.tiny import tiny_test_world
from components.structure import (
    Role,
    StructureError,
    TagIds,
    get_schema,
    merge_attention_inputs,
    parallel_attention_inputs,
    post_merge_mask,
    prediction_sources,
)

REPO = Path(__file__).resolve().parents[3]
BACKENDS = ["torch", "torch-reprefill", "sglang", "async"]


@dataclass(frozen=True)
class Case:
    """A parallel-decoding case: the schema, the block prefix forced into the response, its labels, and
    (fixed-branch fork rules) the number of paths the config asks for."""

    name: str
    schema: str
    prefix: str
    labels: tuple[str, ...]
    paths: int | None = None


CASES = [
    Case("npr-2", "npr", "<guideline><plan>1: add</plan><plan>2: mul</plan></guideline>", ("1", "2")),
    Case(
        "npr-3",
        "npr",
        "<guideline><plan>1: a</plan><plan>2: b</plan><plan>3: c</plan></guideline>",
        ("1", "2", "3"),
    ),
    Case("pr1-2", "parallel_r1", "<Parallel>", ("", "")),
    Case("pr1-3", "parallel_r1", "<Parallel>", ("", "", ""), paths=3),
]
SIX_PLANS = "<guideline>" + "".join(f"<plan>{i}: p</plan>" for i in range(1, 7)) + "</guideline>"


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    model, tok = tiny_test_world(seed=0)
    # Parallel-R1's tags as single tokens too (as pr1_coldstart makes them)
    add_tag_tokens(model, tok, "parallel_r1")
    path = tmp_path_factory.mktemp("tiny-world")
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return model, tok, TagIds.from_tokenizer(tok, "npr"), path


def tags_for(world, schema: str) -> TagIds:
    return TagIds.from_tokenizer(world[1], schema)


@pytest.fixture(scope="module")
def standin(world, tmp_path_factory):
    """One stand-in SGLang server for the module (a real subprocess, started and stopped by the launcher)."""
    _, _, _, path = world
    spec = tmp_path_factory.mktemp("spec") / "server.yaml"
    spec.write_text(
        yaml.safe_dump(
            {
                "python": sys.executable,
                "module": "tests.support.sglang_standin",
                "model_path": "unused",
                "port": 0,
                "tp_size": 1,
                "context_length": 1024,
                "random_seed": 0,
                "enable_deterministic_inference": True,
                "env": {"SGLANG_RETURN_ORIGINAL_LOGPROB": "1"},
            }
        )
    )
    cfg = GenerationConfig(backend="sglang", merge_mode="reprefill", server_spec=str(spec))
    with launched(path, cfg, tmp_path_factory.mktemp("logs")) as url:
        yield url


def run_backend(
    backend: str, world, standin_url: str | None, prompts, cfg: GenerationConfig, prefixes=None, schema="npr"
):
    model, tok, _, _ = world
    tags = tags_for(world, schema) if cfg.mode == "parallel" else None
    if backend == "torch":
        return generate(model, tok, prompts, cfg, tags, response_prefixes=prefixes)
    if backend == "torch-reprefill":
        return generate(
            model, tok, prompts, cfg.model_copy(update={"merge_mode": "reprefill"}), tags, prefixes
        )
    if backend == "sglang":
        sg = cfg.model_copy(
            update={"backend": "sglang", "merge_mode": "reprefill", "server_url": standin_url}
        )
        return generate(None, tok, prompts, sg, tags, response_prefixes=prefixes)
    assert backend == "async"
    server = TorchTokenGenerator(model, end_of_turn_ids(tok), deterministic=True).as_async()
    return asyncio.run(generate_async(tok, prompts, cfg, tags, server, prefixes))


class Backend:
    """``backend(prompts, cfg, prefixes)`` decodes with one backend; ``merge_mode`` is what it must record."""

    def __init__(self, name: str, world, url: str | None) -> None:
        self.name, self.world, self.url = name, world, url
        self.merge_mode = "shared_kv" if name == "torch" else "reprefill"

    def __call__(self, prompts, cfg: GenerationConfig, prefixes=None, schema: str = "npr"):
        gens = run_backend(self.name, self.world, self.url, prompts, cfg, prefixes, schema)
        assert all(g.merge_mode == self.merge_mode for g in gens)
        return gens


@pytest.fixture(params=BACKENDS)
def backend(request, world) -> Backend:
    url = request.getfixturevalue("standin") if request.param == "sglang" else None
    return Backend(request.param, world, url)


def parallel(**kwargs) -> GenerationConfig:
    """Parallel sampling at temperature 1 without the in-step repetition penalty (see the docstring)."""
    return GenerationConfig(mode="parallel", temperature=1.0, step_repetition_penalty=1.0, **kwargs)


def _prompts(tok, n: int) -> list[str]:
    return [
        tok.apply_chat_template(
            [{"role": "user", "content": "what is 2+3" * (k % 3 + 1)}],
            tokenize=False,
            add_generation_prompt=True,
        )
        for k in range(n)
    ]


def _logp(
    model, ids: list[int], mask: torch.Tensor | None = None, pos: torch.Tensor | None = None
) -> torch.Tensor:
    from components.structure import to_additive_mask

    kwargs = {}
    if mask is not None:
        kwargs = {"attention_mask": to_additive_mask(mask)[None, None], "position_ids": pos[None]}
    with torch.no_grad():
        return torch.log_softmax(model(torch.tensor([ids]), **kwargs).logits.float(), -1)[0]


def test_sequential_logprobs_equal_teacher_forcing(world, backend) -> None:
    model, tok, _, _ = world
    cfg = GenerationConfig(max_new_tokens=20, temperature=1.0, batch_size=3, seed=2)
    gens = backend(_prompts(tok, 3), cfg)
    eot = end_of_turn_ids(tok)
    for g in gens:
        assert g.finish_reason in {"stop", "length"} and len(g.token_ids) <= 20 and not g.parallel_taken
        assert not set(g.token_ids) & set(eot)
        p = len(g.prompt_ids)
        lp = _logp(model, g.prompt_ids + g.token_ids)
        tf = lp[p - 1 : p - 1 + len(g.token_ids)].gather(-1, torch.tensor(g.token_ids)[:, None]).squeeze(-1)
        assert (tf - torch.tensor(g.logprobs)).abs().max().item() <= 1e-4
        assert g.position_ids == list(range(p, p + len(g.token_ids)))


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_parallel_structure_positions_and_branch_logprobs(world, backend, case: Case) -> None:
    model, tok, _, _ = world
    tags = tags_for(world, case.schema)
    schema = get_schema(case.schema)
    n, max_step = 6, 6
    prefix_len = len(tok.encode(case.prefix, add_special_tokens=False))
    budget = prefix_len + len(case.labels) * max_step + 12
    cfg = parallel(max_new_tokens=budget, max_step_tokens=max_step, seed=4, paths=case.paths)
    gens = backend(_prompts(tok, n), cfg, [case.prefix] * n, schema=case.schema)
    # the schema's fork rule, by role: NPR </guideline> -> <step>...</step> -> <takeaway>; Parallel-R1
    # <Parallel> -> <Path>...</Path> -> </Parallel> <Summary> (forced)
    rule = schema.fork
    trigger, opener, closer = (tags.id_for(r) for r in (rule.trigger, rule.branch_open, rule.branch_close))
    merged_first = tags.id_for(rule.merge[0])
    summary_close = tags.id_for(Role.SUMMARY_CLOSE)
    checked = 0
    for g in gens:
        assert g.total_tokens <= budget and g.fork_refusals == []
        block = g.blocks[0]
        assert block.merged and tuple(block.labels) == case.labels and block.n_branches == len(case.labels)
        # canonical layout: the trigger then a branch opener; each closer then the next opener or the merge
        start = block.start
        assert g.token_ids[start - 1] == trigger and g.token_ids[start] == opener
        ends = [start + sum(block.branch_tokens[: j + 1]) for j in range(block.n_branches)]
        for j, end in enumerate(ends):
            assert g.token_ids[end - 1] == closer
            nxt = opener if j + 1 < len(ends) else merged_first
            if end < len(g.token_ids):
                assert g.token_ids[end] == nxt
        merge = [tags.id_for(r) for r in rule.merge]
        assert g.token_ids[ends[-1] : ends[-1] + len(merge)] == merge[: len(g.token_ids) - ends[-1]]
        assert all(g.forced[ends[-1] : ends[-1] + len(merge)])
        p = len(g.prompt_ids)
        ids = g.prompt_ids + g.token_ids + [summary_close]
        try:
            mask, pos = parallel_attention_inputs(ids, tags, start=p)
        except StructureError:
            continue  # the random model wrote a stray tag after the block: the trainer filters it
        k = len(g.token_ids)
        assert pos[p : p + k].tolist() == g.position_ids  # canonical positions from every backend
        lp = _logp(model, ids, mask, pos)
        sources = prediction_sources(mask)[p : p + k]
        tf = lp[sources].gather(-1, torch.tensor(g.token_ids)[:, None]).squeeze(-1)
        got = torch.tensor(g.logprobs)
        # one rule for "after the merge" (components.structure.post_merge_mask, a parse of the ids) agrees
        # with the engine's own block ledger: from the end of the first merged block of 2+ branches on
        first = next((b for b in g.blocks if b.merged and b.n_branches >= 2), None)
        ledger = [first is not None and i >= first.start + sum(first.branch_tokens) for i in range(k)]
        post = torch.from_numpy(post_merge_mask(ids, tags, p)[:k])
        assert post.tolist() == ledger
        branch = torch.zeros(k, dtype=torch.bool)
        branch[start : ends[-1]] = True
        finite = torch.isfinite(got)
        assert finite[~torch.tensor(g.forced)].all()  # sampled tokens always carry their log-prob
        assert ((tf - got).abs()[branch & finite]).max().item() <= 1e-4  # branch tokens: exact everywhere
        if g.merge_mode == "shared_kv":
            assert ((tf - got).abs()[finite]).max().item() <= 1e-4
        else:
            # re-prefill: the tokens after the merge are those of a sequential read of the flat text
            seq = _logp(model, g.prompt_ids + g.token_ids)
            seq_tf = seq[p - 1 : p - 1 + k].gather(-1, torch.tensor(g.token_ids)[:, None]).squeeze(-1)
            assert ((seq_tf - got).abs()[post & finite]).max().item() <= 1e-4
        # the trainer under the semantics the backend samples exactly (shared_kv: isolated, every
        # re-prefilling backend: reread) reproduces EVERY token's log-prob, post-merge ones included
        assert g.merge_semantics == ("isolated" if g.merge_mode == "shared_kv" else "reread")
        laid, laid_mask, laid_pos, index = merge_attention_inputs(ids, tags, p, g.merge_semantics)
        laid_lp = _logp(model, laid.tolist(), laid_mask, laid_pos)
        laid_src = prediction_sources(laid_mask)[index[p : p + k]]
        laid_tf = laid_lp[laid_src].gather(-1, torch.tensor(g.token_ids)[:, None]).squeeze(-1)
        assert ((laid_tf - got).abs()[finite]).max().item() <= 1e-4
        if post.any():
            # and the other semantics does not: the post-merge tokens are where the two differ
            other = "reread" if g.merge_semantics == "isolated" else "isolated"
            o_ids, o_mask, o_pos, o_index = merge_attention_inputs(ids, tags, p, other)
            o_tf = _logp(model, o_ids.tolist(), o_mask, o_pos)[prediction_sources(o_mask)[o_index[p : p + k]]]
            o_tf = o_tf.gather(-1, torch.tensor(g.token_ids)[:, None]).squeeze(-1)
            assert ((o_tf - got).abs()[~post & finite]).max().item() <= 1e-4
            assert ((o_tf - got).abs()[post & finite]).max().item() > 1e-3
        checked += 1
    # the random model writes a stray tag after the block in some samples (skipped above): under the
    # named-value test tokenizer 2 of 6 samples of the 3-plan case remain on some backends
    assert checked >= 2


def test_refusals_are_recorded_and_decoding_goes_on(world, backend) -> None:
    _, tok, _, _ = world
    cfg = parallel(max_new_tokens=60, max_step_tokens=6, seed=1)
    g = backend(_prompts(tok, 1), cfg, [SIX_PLANS])[0]
    assert not g.parallel_taken and any("max_branches" in r for r in g.fork_refusals)
    assert g.total_tokens <= 60 and g.finish_reason in {"stop", "length"}


def test_fork_admitted_exactly_at_the_budget_edge(world, backend) -> None:
    _, tok, _, _ = world
    case = CASES[0]
    prefix_len = len(tok.encode(case.prefix, add_special_tokens=False))
    label_len = len(tok.encode("1:", add_special_tokens=False))
    cost = TokenLedger(10).fork_cost([1 + label_len, 1 + label_len], min_step_tokens=1)
    step = 1 + label_len + 2
    edge = parallel(max_new_tokens=prefix_len + cost, max_step_tokens=step)
    g = backend(_prompts(tok, 1), edge, [case.prefix])[0]
    assert g.parallel_taken and g.fork_refusals == [] and g.total_tokens == prefix_len + cost
    assert g.blocks[0].merged and g.finish_reason == "length"
    short = parallel(max_new_tokens=prefix_len + cost - 1, max_step_tokens=step)
    g = backend(_prompts(tok, 1), short, [case.prefix])[0]
    assert not g.parallel_taken and "token budget" in g.fork_refusals[0]
    assert g.total_tokens <= prefix_len + cost - 1


def test_budget_is_never_overspent_and_a_cut_block_is_kept_unmerged(world, backend) -> None:
    _, tok, _, _ = world
    case = CASES[1]
    prefix_len = len(tok.encode(case.prefix, add_special_tokens=False))
    # room for the fork but not for three full steps: the block is cut by the budget, kept in plan order
    cfg = parallel(max_new_tokens=prefix_len + 16, max_step_tokens=12)
    gens = backend(_prompts(tok, 3), cfg, [case.prefix] * 3)
    cut = 0
    for g in gens:
        assert g.total_tokens <= prefix_len + 16
        assert len(g.logprobs) == len(g.token_ids) == len(g.position_ids) == len(g.forced)
        if g.parallel_taken and not g.blocks[0].merged:
            cut += 1
            assert g.finish_reason == "length" and not any(math.isnan(x) for x in g.logprobs[:prefix_len])
            assert g.blocks[0].labels == list(case.labels) and sum(g.blocks[0].branch_tokens) <= 15
    assert cut >= 1  # a random model rarely closes a step within one content token


def test_parallel_r1_refuses_more_paths_than_max_branches(world, backend) -> None:
    _, tok, _, _ = world
    cfg = parallel(max_new_tokens=40, max_step_tokens=6, seed=1, paths=6, max_branches=5)
    g = backend(_prompts(tok, 1), cfg, ["<Parallel>"], schema="parallel_r1")[0]
    assert not g.parallel_taken and g.fork_refusals[0] == "6 branches > max_branches 5"
    assert g.total_tokens <= 40 and g.finish_reason in {"stop", "length"}


def test_parallel_r1_fork_admitted_exactly_at_the_budget_edge(world, backend) -> None:
    """Two paths of <Path> + one token + </Path>, then the forced </Parallel><Summary>: 8 tokens after the
    trigger; one token less and the fork is refused."""
    _, tok, _, _ = world
    cost = TokenLedger(10).fork_cost([1, 1], min_step_tokens=1, merge_tokens=2)
    edge = parallel(max_new_tokens=1 + cost, max_step_tokens=3)
    g = backend(_prompts(tok, 1), edge, ["<Parallel>"], schema="parallel_r1")[0]
    assert g.parallel_taken and g.fork_refusals == [] and g.total_tokens == 1 + cost == 9
    assert g.blocks[0].merged and g.blocks[0].branch_tokens == [3, 3] and g.finish_reason == "length"
    short = parallel(max_new_tokens=cost, max_step_tokens=3)
    g = backend(_prompts(tok, 1), short, ["<Parallel>"], schema="parallel_r1")[0]
    assert not g.parallel_taken and "token budget" in g.fork_refusals[0]
