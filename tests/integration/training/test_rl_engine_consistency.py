"""The RL trainer scores a rollout with exactly the log-probs the engine sampled it with.

This is what makes PAPO's ratio pi/sg(pi) the on-policy gradient it claims to be: same mask, same positions,
same prediction rule (a step's first token is predicted from where the engine forked it).
"""

from __future__ import annotations

import pytest
import torch

from components.engine import GenerationConfig, generate
from components.models.tiny import tiny_test_world
from components.structure import StructureError, TagIds
from components.training.rl_batch import Rollout, build_policy_batch, response_log_probs

PLANS = "<guideline><plan>1: left</plan><plan>2: right</plan><plan>3: check</plan></guideline>"


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_trainer_logprobs_equal_engine_logprobs(attn: str) -> None:
    model, tok = tiny_test_world(seed=0)
    model.config._attn_implementation = attn
    tags = TagIds.from_tokenizer(tok, "npr")
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "2+3?"}], tokenize=False, add_generation_prompt=True
    )
    # 64 new tokens: the plans prefix takes more tokens under the bracket-chain test tokenizer, and 48 cut
    # every third step short (an unclosed step is not a trace the trainer accepts). 36 samples: under the
    # named-value test tokenizer about a quarter of the random model's traces are well formed.
    cfg = GenerationConfig(
        mode="parallel", max_new_tokens=64, temperature=1.0, batch_size=12, max_step_tokens=6, seed=5
    )
    gens = generate(model, tok, [prompt] * 36, cfg, tags, response_prefixes=[PLANS] * 36)
    close = tags.ids["</takeaway>"]
    rollouts, engine_lps = [], []
    for g in gens:
        # close an open takeaway so the trace is well formed; the extra last token changes no earlier logit
        ids = g.token_ids + ([close] if close not in g.token_ids else [])
        r = Rollout("g", "p", "0", g.prompt_ids, ids, g.text, g.finish_reason, g.parallel_taken)
        try:
            build_policy_batch([r], pad_id=tok.pad_token_id, tags=tags)
        except StructureError:
            continue  # random weights wrote a stray tag: the trainer filters such rollouts
        rollouts.append(r)
        engine_lps.append(torch.tensor(g.logprobs))
    assert len(rollouts) >= 6
    batch = build_policy_batch(rollouts, pad_id=tok.pad_token_id, tags=tags)
    with torch.no_grad():
        log_prob, _ = response_log_probs(model, batch)
    for b, lp in enumerate(engine_lps):
        assert (log_prob[b, : len(lp)] - lp).abs().max().item() <= 1e-4


def test_sequential_rollouts_padded_together_keep_the_engine_logprobs() -> None:
    # NPR-Zero / SR: prompts of different lengths are right-padded into one causal batch; every response
    # token (and the stop token) must get the log-prob the engine sampled it with
    model, tok = tiny_test_world(seed=0)
    questions = ["2+3?", "Compute (7 + 3) + (5 - 8), please.", "1?"]
    prompts = [
        tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
        for q in questions * 3
    ]
    cfg = GenerationConfig(mode="sequential", max_new_tokens=24, temperature=1.0, batch_size=9, seed=5)
    gens = generate(model, tok, prompts, cfg)
    rollouts, engine_lps = [], []
    for g in gens:
        stop = [g.stop_token_id] if g.stop_token_id is not None else []
        rollouts.append(
            Rollout("g", "p", "0", g.prompt_ids, g.token_ids + stop, g.text, g.finish_reason, False)
        )
        engine_lps.append(torch.tensor(g.logprobs + ([g.stop_logprob] if stop else [])))
    assert len({len(r.prompt_ids) for r in rollouts}) == 3
    batch = build_policy_batch(rollouts, pad_id=tok.pad_token_id)
    with torch.no_grad():
        log_prob, _ = response_log_probs(model, batch)
    for b, lp in enumerate(engine_lps):
        assert (log_prob[b, : len(lp)] - lp).abs().max().item() <= 1e-4
