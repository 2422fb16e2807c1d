"""Test data builders shared by several test files: SFT examples, RL rollouts (random tokens or rendered
synthetic trajectories). One copy each, so a change to the data a test trains on is made once."""

from __future__ import annotations

import random
from typing import Any

from components.data import synthetic
from components.prompts import render_prompt
from components.training.rl_batch import Rollout
from components.training.sft_data import encode_example


def sequential_sft_examples(tokenizer: Any, n: int) -> list[Any]:
    """``n`` easy synthetic problems as sequential SFT examples, each prompt rendered by the chat template."""
    rng = random.Random(0)
    out = []
    for i, rec in enumerate(synthetic.generate_problems(n, 0, {"easy": 1.0})):
        prompt = tokenizer.apply_chat_template(
            [{"role": "user", "content": rec["problem"]}], tokenize=False, add_generation_prompt=True
        )
        out.append(encode_example(tokenizer, prompt, synthetic.render_solution(rec, "sequential", rng), i))
    return out


def random_rollout_groups(vocab: int, n_groups: int = 3, size: int = 4) -> list[list[Rollout]]:
    """Groups of ``size`` rollouts of random tokens (ids 5..vocab) with mixed rewards: an RL update's input
    where only the shapes and numbers matter."""
    rng = random.Random(0)
    groups = []
    for g in range(n_groups):
        prompt = [rng.randrange(5, vocab) for _ in range(rng.randint(6, 20))]
        groups.append(
            [
                Rollout(
                    group_id=f"g{g}",
                    problem_id=f"p{g}",
                    answer="1",
                    prompt_ids=prompt,
                    response_ids=[rng.randrange(5, vocab) for _ in range(rng.randint(2, 30))],
                    text="",
                    finish_reason="stop",
                    parallel_taken=False,
                    reward=float(rng.choice([-1.0, 1.0, 0.5])),
                )
                for _ in range(size)
            ]
        )
    return groups


def rendered_rollouts(
    tok: Any, cfg: Any, n: int, *, parallel: bool = True, mistake: str | None = None, seed: int = 3
) -> list[Rollout]:
    """``n`` synthetic problems with their solutions rendered as trajectories (parallel or sequential; a
    ``mistake`` makes the parallel rendering malformed that way), two per group, prompts as the engine
    renders them."""
    rng = random.Random(seed)
    out = []
    for i, p in enumerate(synthetic.generate_problems(n, seed=seed)):
        prompt = render_prompt(tok, p["problem"], cfg.prompts, "parallel")
        expr = synthetic.expression_of(p)
        text = synthetic.render_parallel(expr, rng, mistake) if parallel else synthetic.render_sequential(expr, rng)
        out.append(
            Rollout(
                group_id=f"g{i // 2}",
                problem_id=p["id"],
                answer=p["answer"],
                prompt_ids=tok.encode(prompt, add_special_tokens=False),
                response_ids=tok.encode(text, add_special_tokens=False) + [tok.eos_token_id],
                text=text,
                finish_reason="stop",
                parallel_taken=parallel,
            )
        )
    return out
