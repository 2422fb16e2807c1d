"""A tiny Qwen3 briefly taught the parallel format, so RL tests have rollouts with varied rewards."""

from __future__ import annotations

import copy
import random

import pytest
import torch

from components.config import load_config
from components.data.synthetic import expression_of, generate_problems, render_parallel, render_sequential
from components.models.tiny import tiny_test_world
from components.prompts import render_prompt


def warm_up(
    model, tok, cfg, steps: int, batch: int = 16, lr: float = 3e-3, seed: int = 0, parallel_share: float = 0.8
) -> None:
    """Some causal-LM steps on rendered solutions (``parallel_share`` of them parallel), loss on the response
    only."""
    rng = random.Random(seed)
    problems = generate_problems(400, seed=seed + 11, weights={"easy": 1.0})  # the shortest traces
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    for _ in range(steps):
        rows, labels = [], []
        for p in rng.sample(problems, batch):
            parallel = rng.random() < parallel_share
            prompt = render_prompt(tok, p["problem"], cfg.prompts, "parallel")
            text = (
                render_parallel(expression_of(p), rng)
                if parallel
                else render_sequential(expression_of(p), rng)
            )
            prompt_ids = tok.encode(prompt, add_special_tokens=False)
            resp = tok.encode(text, add_special_tokens=False) + [tok.eos_token_id]
            rows.append(prompt_ids + resp)
            labels.append([-100] * len(prompt_ids) + resp)
        length = max(len(r) for r in rows)
        ids = torch.full((len(rows), length), tok.pad_token_id)
        lab = torch.full((len(rows), length), -100)
        att = torch.zeros(len(rows), length, dtype=torch.long)
        for i, (r, lb) in enumerate(zip(rows, labels, strict=True)):
            ids[i, : len(r)], lab[i, : len(r)], att[i, : len(r)] = torch.tensor(r), torch.tensor(lb), 1
        loss = model(input_ids=ids, attention_mask=att, labels=lab).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()


@pytest.fixture(scope="session")
def warm_world_state():
    torch.set_num_threads(1)
    cfg = load_config(profile="tiny")
    model, tok = tiny_test_world(seed=0)
    warm_up(model, tok, cfg, steps=100, batch=16, lr=5e-3)
    return copy.deepcopy(model.state_dict()), tok


@pytest.fixture
def warm_world(warm_world_state):
    """(model, tokenizer): a fresh copy of the warmed model for each test."""
    state, tok = warm_world_state
    model, _ = tiny_test_world(seed=0)
    model.load_state_dict(state)
    model.eval()
    return model, tok
