"""One process of the FSDP SFT test (run by torchrun, or alone as the single-process reference).

    python sft_fsdp_worker.py WORK_DIR OUT_FILE STEPS MODE [CRASH_AFTER]

Trains the tiny test world with ``train_sft`` for STEPS steps (resuming from WORK_DIR's checkpoints) in
MODE (parallel | sequential) and writes the final unsharded weights to OUT_FILE (rank 0). With
CRASH_AFTER, rank 0 dies (exit 3) right after that step, as a preempted job would.
"""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from components.config import load_config
from components.data import synthetic
from components.models.tiny import tiny_test_world
from components.prompts import render_prompt
from components.structure import TagIds
from components.training.distributed import DistContext, full_model_state
from components.training.sft import EpochSource, SFTSettings, train_sft
from components.training.sft_data import encode_example


def main() -> None:
    work, out, steps, mode = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    crash_after = int(sys.argv[5]) if len(sys.argv) > 5 else None
    torch.set_num_threads(1)
    ctx = DistContext.from_env()
    model, tok = tiny_test_world(seed=0)
    cfg = load_config(profile="tiny")
    rng = random.Random(0)
    examples = [
        encode_example(
            tok,
            render_prompt(tok, rec["problem"], cfg.prompts, "parallel"),
            synthetic.render_solution(rec, "parallel", rng),
        )
        for rec in synthetic.generate_problems(24, 3, {"easy": 1.0})
    ]
    settings = SFTSettings(
        mode=mode,
        total_steps=steps,
        batch_size=4,
        grad_accum=2,
        lr=3e-3,
        warmup_steps=1,
        save_every=2,
        seed=0,
    )
    tags = TagIds.from_tokenizer(tok, "npr") if mode == "parallel" else None
    train_sft(
        model,
        EpochSource(examples, settings.examples_per_step, seed=1),
        settings,
        work,
        pad_id=tok.pad_token_id,
        tags=tags,
        show_progress=False,
        ctx=ctx,
        on_step=lambda step, _: os._exit(3) if step == crash_after else None,
    )
    state = full_model_state(model) if ctx.active else dict(model.state_dict())
    if ctx.is_main:
        state.pop("lm_head.weight", None)  # tied to the embeddings
        save_file({k: v.detach().contiguous() for k, v in state.items()}, str(out))


if __name__ == "__main__":
    main()
