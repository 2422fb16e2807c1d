"""The torch engine on a real (random-init) tiny Qwen3: exactness against teacher forcing, budgets, forks.

Exactness is the test NPR never had: the engine's per-token log-probabilities must equal those a trainer
recomputes over the final sequence with ``parallel_attention_inputs`` (max abs diff <= 1e-4).
"""

from __future__ import annotations

import pytest
import torch

from components.engine import GenerationConfig, generate
from components.engine.decoder import end_of_turn_ids
from components.engine.ledger import TokenLedger
from components.engine.parallel import EngineTags, plan_fork
from components.models.tiny import tiny_test_world
from components.structure import (
    StructureError,
    TagIds,
    parallel_attention_inputs,
    prediction_sources,
    to_additive_mask,
)

TWO_PLANS = "<guideline><plan>1: add</plan><plan>2: mul</plan></guideline>"
THREE_PLANS = "<guideline><plan>1: a</plan><plan>2: b</plan><plan>3: c</plan></guideline>"


@pytest.fixture(scope="module")
def world():
    model, tok = tiny_test_world(seed=0)
    return model, tok, TagIds.from_tokenizer(tok, "npr")


def _prompts(tok, n: int) -> list[str]:
    return [
        tok.apply_chat_template(
            [{"role": "user", "content": "what is 2+3" * (k % 5 + 1)}],
            tokenize=False,
            add_generation_prompt=True,
        )
        for k in range(n)
    ]


def _teacher_forced(
    model, ids: list[int], mask: torch.Tensor | None, pos: torch.Tensor | None
) -> torch.Tensor:
    kwargs = {}
    if mask is not None:
        kwargs = {"attention_mask": to_additive_mask(mask)[None, None], "position_ids": pos[None]}
    with torch.no_grad():
        return torch.log_softmax(model(torch.tensor([ids]), **kwargs).logits.float(), -1)[0]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_sequential_logprobs_equal_teacher_forcing_with_left_padding(world, temperature: float) -> None:
    model, tok, _ = world
    cfg = GenerationConfig(
        max_new_tokens=24, temperature=temperature, top_p=0.9, top_k=50, batch_size=6, seed=1
    )
    gens = generate(model, tok, _prompts(tok, 6), cfg)
    for g in gens:
        assert g.finish_reason in {"stop", "length"} and len(g.token_ids) <= 24
        assert len(g.logprobs) == len(g.position_ids) == len(g.forced) == len(g.token_ids)
        p = len(g.prompt_ids)
        lp = _teacher_forced(model, g.prompt_ids + g.token_ids, None, None)
        tf = lp[p - 1 : p - 1 + len(g.token_ids)].gather(-1, torch.tensor(g.token_ids)[:, None]).squeeze(-1)
        assert (tf - torch.tensor(g.logprobs)).abs().max().item() <= 1e-4
        assert g.position_ids == list(range(p, p + len(g.token_ids)))
        assert not g.parallel_taken and g.critical_path_tokens == g.total_tokens


def test_greedy_batch_equals_one_by_one_and_seeds_reproduce(world) -> None:
    model, tok, _ = world
    prompts = _prompts(tok, 4)
    greedy = GenerationConfig(max_new_tokens=16, temperature=0.0, batch_size=4)
    batched = [g.token_ids for g in generate(model, tok, prompts, greedy)]
    alone = [generate(model, tok, [p], greedy)[0].token_ids for p in prompts]
    assert batched == alone
    sampled = GenerationConfig(max_new_tokens=16, temperature=1.0, batch_size=4, seed=7)
    assert [g.token_ids for g in generate(model, tok, prompts, sampled)] == [
        g.token_ids for g in generate(model, tok, prompts, sampled)
    ]


def test_end_of_turn_stops_and_is_not_in_the_response(world) -> None:
    model, tok, _ = world
    eot = end_of_turn_ids(tok)
    cfg = GenerationConfig(max_new_tokens=400, temperature=1.0, batch_size=32, seed=0)
    gens = generate(model, tok, _prompts(tok, 32), cfg)
    stopped = [g for g in gens if g.finish_reason == "stop"]
    assert stopped, "a random model over a ~300-token vocabulary emits end-of-turn within 400 tokens"
    for g in stopped:
        assert g.stop_token_id in eot and not set(g.token_ids) & set(eot) and g.stop_logprob < 0


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_parallel_logprobs_and_positions_equal_the_trainer(world, temperature: float) -> None:
    model, tok, tags = world
    prefix_len = len(tok.encode(THREE_PLANS, add_special_tokens=False))
    max_step = 6
    # Greedy: the budget ends right after <takeaway> (a random model would then repeat a tag forever).
    budget = prefix_len + 3 * max_step + 1 if temperature == 0 else 40
    cfg = GenerationConfig(
        mode="parallel",
        max_new_tokens=budget,
        temperature=temperature,
        batch_size=40,
        max_step_tokens=max_step,
    )
    prefixes = [THREE_PLANS if k % 2 else TWO_PLANS for k in range(40)]
    gens = generate(model, tok, _prompts(tok, 40), cfg, tags, response_prefixes=prefixes)
    close = tags.ids["</takeaway>"]
    checked = 0
    for g in gens:
        assert g.parallel_taken and g.blocks[0].merged
        assert g.critical_path_tokens < g.total_tokens <= budget
        p = len(g.prompt_ids)
        # Closing the open takeaway at the very end changes no earlier logit (it is the last token).
        ids = g.prompt_ids + g.token_ids + [close]
        try:
            mask, pos = parallel_attention_inputs(ids, tags, start=p)
        except StructureError:
            continue  # the random model wrote a stray tag: the trainer rejects the sample
        lp = _teacher_forced(model, ids, mask, pos)
        n = len(g.token_ids)
        # the trainer's rule: each token is predicted from the last earlier position it can see
        sources = prediction_sources(mask)[p : p + n]
        assert (sources != torch.arange(p - 1, p - 1 + n)).sum() == len(g.blocks[0].labels) - 1
        tf = lp[sources].gather(-1, torch.tensor(g.token_ids)[:, None]).squeeze(-1)
        assert (tf - torch.tensor(g.logprobs)).abs().max().item() <= 1e-4
        assert pos[p : p + n].tolist() == g.position_ids
        checked += 1
    assert checked >= 20


def test_fork_admitted_exactly_at_the_budget_edge(world) -> None:
    model, tok, tags = world
    prefix_len = len(tok.encode(TWO_PLANS, add_special_tokens=False))
    label_len = len(tok.encode("1:", add_special_tokens=False))
    cost = TokenLedger(10).fork_cost([1 + label_len, 1 + label_len], min_step_tokens=1)
    base = {"mode": "parallel", "temperature": 1.0, "max_step_tokens": 1 + label_len + 2}
    edge = GenerationConfig(max_new_tokens=prefix_len + cost, **base)
    g = generate(model, tok, _prompts(tok, 1), edge, tags, response_prefixes=[TWO_PLANS])[0]
    assert g.parallel_taken and g.fork_refusals == [] and g.total_tokens == prefix_len + cost
    short = GenerationConfig(max_new_tokens=prefix_len + cost - 1, **base)
    g = generate(model, tok, _prompts(tok, 1), short, tags, response_prefixes=[TWO_PLANS])[0]
    assert not g.parallel_taken and "token budget" in g.fork_refusals[0]
    assert g.total_tokens <= prefix_len + cost - 1


def test_kv_budget_refuses_the_fork_and_finishes_with_its_reason(world) -> None:
    model, tok, tags = world
    prompt = _prompts(tok, 1)
    p = len(tok.encode(prompt[0], add_special_tokens=False))
    prefix_len = len(tok.encode(TWO_PLANS, add_special_tokens=False))
    cfg = GenerationConfig(mode="parallel", max_new_tokens=200, kv_budget_tokens=p + prefix_len + 3)
    g = generate(model, tok, prompt, cfg, tags, response_prefixes=[TWO_PLANS])[0]
    assert not g.parallel_taken and "kv budget" in g.fork_refusals[0]
    assert (
        g.finish_reason in {"kv_budget", "stop"} and len(g.prompt_ids) + g.total_tokens <= p + prefix_len + 3
    )


@pytest.mark.parametrize(
    ("block", "reason"),
    [
        ("<plan>1: a</plan></guideline>", "no <guideline>"),
        ("<guideline>no plans here</guideline>", "no plans"),
        ("<guideline><plan>a</plan></guideline>", "no label"),
        ("<guideline><plan>1: a</plan><plan>1: b</plan></guideline>", "duplicate"),
        ("<guideline><plan>1: a</plan><step>x</guideline>", "illegal tag"),
        (
            "<guideline>" + "".join(f"<plan>{i}: p</plan>" for i in range(1, 7)) + "</guideline>",
            "max_branches",
        ),
    ],
)
def test_pre_branch_validator_refuses_illegal_blocks(world, block: str, reason: str) -> None:
    _, tok, tags = world
    ids = tok.encode(block, add_special_tokens=False)
    decision = plan_fork(ids, tok, EngineTags.from_tag_ids(tags), TokenLedger(1000), 5, 1)
    assert isinstance(decision, str) and reason in decision


def test_hundreds_of_random_prompts_in_parallel_mode_never_crash_or_overspend(world) -> None:
    model, tok, tags = world
    n = 240
    prompts = _prompts(tok, n)
    # A third start with a valid guideline (forks), a third with a 6-plan one (refused), a third free.
    six = "<guideline>" + "".join(f"<plan>{i}: p</plan>" for i in range(1, 7)) + "</guideline>"
    prefixes = [[TWO_PLANS, six, ""][k % 3] for k in range(n)]
    cfg = GenerationConfig(
        mode="parallel", max_new_tokens=48, temperature=1.0, batch_size=120, kv_budget_tokens=120, seed=3
    )
    gens = generate(model, tok, prompts, cfg, tags, response_prefixes=prefixes)
    assert len(gens) == n
    for k, g in enumerate(gens):
        assert g.total_tokens <= 48 and len(g.prompt_ids) + g.total_tokens <= 120
        assert g.finish_reason in {"stop", "length", "kv_budget"}
        assert len(g.logprobs) == len(g.token_ids) == len(g.position_ids)
        assert sum(b.n_branches for b in g.blocks) <= 5 * max(len(g.blocks), 1)
        if k % 3 == 1:
            assert any("max_branches" in r for r in g.fork_refusals)
    assert sum(g.parallel_taken for g in gens) >= n // 3
