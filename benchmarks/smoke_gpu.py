"""Device smoke test: one script, one GPU, no network, prints one table (docs/results.md keeps it).

    python benchmarks/smoke_gpu.py            # on a CUDA GPU (about 5 minutes on an H200)
    python benchmarks/smoke_gpu.py --cpu      # the same code on CPU, small shapes (20-40 min on 2 cores)
    python benchmarks/smoke_gpu.py --cpu --stages sample_orz   # what the test runs (about a minute)

Uses only the installed torch/transformers and this repository. Two parts:

1. **The tiny profile's stages on the device**, a few steps each, through the stage runner in a scratch
   workspace: sample_orz, seed, npr_zero, distill, reject_filter, parallel_warmup, papo_rl, evaluate.
   (If the briefly trained seed has no accepted trajectory, the warmup trains on the synthetic task
   family's own parallel solutions; the table says so.)
2. **A Qwen3-4B-shaped random-init model** (``--cpu``: a small Qwen3 of the same proportions): decoding
   tokens/s, parallel vs sequential, at 4k new tokens through ``components.engine``; one parallel-mask SFT
   step and one PAPO update, each with its peak memory next to the planner's estimate
   (``components.training.memory``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

QWEN3_4B = dict(hidden=2560, intermediate=9728, layers=36, heads=32, kv_heads=8, head_dim=128, vocab=151936)
SMALL = dict(hidden=128, intermediate=384, layers=2, heads=4, kv_heads=2, head_dim=32, vocab=2048)

Row = tuple[str, str, str, str]  # what, measured, planner, note


def _fmt_gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


# ------------------------------------------------------------------------------------------ part 1
STAGES = [
    "sample_orz",
    "seed",
    "npr_zero",
    "distill",
    "reject_filter",
    "parallel_warmup",
    "papo_rl",
    "evaluate",
]


def stage_overrides(device: str, dtype: str, cpu: bool) -> list[str]:
    few = {
        f"run.device={device}",
        f"run.dtype={dtype}",
        "run.torch_threads=2",
        "tracking.mode=disabled",  # no W&B run per stage: the smoke measures the stages, not tracking
        "grading.workers=1",
        "sample_orz.synthetic_pool=600",
        "sample_orz.n=300",
        "sample_orz.test_n=16",
        "sample_orz.val_n=16",
        "seed.steps=" + ("6" if cpu else "200"),
        "seed.save_every=100",
        "seed.eval_n=8",
        "models.tiny.tokenizer_corpus_size=" + ("400" if cpu else "4000"),
        "distill.n_problems=8",
        "distill.k=2",
        "reject_filter.min_acceptance_rate=0.0",
        "parallel_warmup.max_steps=2",
        "parallel_warmup.batch_size=4",
        "evaluate.checkpoints=[seed,npr_zero,parallel_warmup,papo_rl]",
        "evaluate.parallel_checkpoints=[parallel_warmup,papo_rl]",
        "evaluate.benchmarks=[{name: tiny_test, n_samples: 1, k: 1, max_problems: 8}]",
    }
    for rl in ("npr_zero", "papo_rl"):
        few |= {
            f"{rl}.steps=1",
            f"{rl}.prompts_per_step=2",
            f"{rl}.gen_batch_prompts=2",
            f"{rl}.group_size=4",
            f"{rl}.eval_n=4",
            f"{rl}.eval_samples=1",
            f"{rl}.eval_before_train=false",
            f"{rl}.max_gen_batches=1",
            f"{rl}.save_every=1",
        }
    return sorted(few)


def _synthetic_accepted(cfg, directory: Path) -> int:
    """Parallel-format solutions of the synthetic task family, as accepted-trajectory records."""
    from components.artifacts import write_shards
    from components.data import synthetic

    rng = random.Random(0)
    rows = []
    for i, p in enumerate(synthetic.generate_problems(16, seed=3)):
        text = synthetic.render_parallel(synthetic.expression_of(p), rng)
        rows.append(
            {
                **p,
                "problem_id": p["id"],
                "sample_idx": 0,
                "prompt": "",
                "response": text,
                "correct": True,
                "valid": True,
                "format_score": 0.0,
                "finish_reason": "stop",
                "n_tokens": 0,
                "answer_pred": p["answer"],
                "structure": {},
                "idx": i,
            }
        )
    shutil.rmtree(directory, ignore_errors=True)
    write_shards(directory, rows, 1)
    return len(rows)


def run_tiny_stages(device: torch.device, cpu: bool, stages: list[str]) -> list[Row]:
    from components.config import materialise_profile
    from components.stages import run_stage
    from components.stages.reject_filter import QualityGateError
    from components.training.memory_probe import measure

    dtype = "float32" if device.type == "cpu" else "bfloat16"
    rows: list[Row] = []
    home = Path.cwd()
    work = Path(tempfile.mkdtemp(prefix="npr-smoke-"))
    try:
        for name in ("dvc.yaml", "configs", "prompts", "components", "flows", "eval", "models"):  # models: the seed
            (work / name).symlink_to(ROOT / name)
        os.chdir(work)
        cfg = materialise_profile("tiny", stage_overrides(device.type, dtype, cpu), dest=work / "params.yaml")
        for stage in stages:
            note = ""
            start = time.perf_counter()
            with measure(device) as reading:
                try:
                    metrics = run_stage(stage, cfg)
                except QualityGateError as err:  # a few seed steps accept nothing: train on the task family
                    accepted = work / "artifacts" / "reject_filter" / "accepted"
                    metrics = {"accepted": _synthetic_accepted(cfg, accepted)}
                    note = f"{err}; the warmup trains on {metrics['accepted']} synthetic parallel solutions"
            wall = time.perf_counter() - start
            detail = {
                "seed": lambda m: f"loss {m.get('final_loss', float('nan')):.3f}",
                "npr_zero": lambda m: f"format-valid {m.get('final/format_valid', 0):.2f}",
                "distill": lambda m: f"{m.get('trajectories', m.get('n_trajectories', '?'))} trajectories",
                "reject_filter": lambda m: f"accepted {m.get('accepted', '?')}",
                "parallel_warmup": lambda m: f"loss {m.get('final_loss', float('nan')):.3f}",
                "papo_rl": lambda m: f"rollouts {m.get('train/rollouts_trained', 0):.0f}",
            }.get(stage, lambda m: "")(metrics)
            rows.append(
                (
                    f"stage {stage} on {device.type}",
                    f"{wall:.1f} s, peak {_fmt_gib(reading.peak_bytes)}",
                    "",
                    "; ".join(x for x in (detail, note) if x),
                )
            )
    finally:
        os.chdir(home)
        shutil.rmtree(work, ignore_errors=True)
    return rows


# ------------------------------------------------------------------------------------------ part 2
def build_model(shape: dict, device: torch.device, dtype: torch.dtype):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        hidden_size=shape["hidden"], intermediate_size=shape["intermediate"], num_hidden_layers=shape["layers"],
        num_attention_heads=shape["heads"], num_key_value_heads=shape["kv_heads"], head_dim=shape["head_dim"],
        vocab_size=shape["vocab"], max_position_embeddings=40960, tie_word_embeddings=True,
    )  # fmt: skip
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen3ForCausalLM(config)
    return model.to(dtype)


def decode_rows(model, tok, tags, new_tokens: int, batch: int) -> list[Row]:
    from components.engine import GenerationConfig, generate

    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "2 + 3 * 4 = ?"}], tokenize=False, add_generation_prompt=True
    )
    forced = "<guideline><plan>1: left</plan><plan>2: right</plan><plan>3: check</plan></guideline>"
    out = []
    speed = {}
    for mode in ("sequential", "parallel"):
        cfg = GenerationConfig(
            mode=mode, temperature=1.0, max_new_tokens=new_tokens, batch_size=batch, seed=0,
            max_step_tokens=new_tokens // 4, min_step_tokens=1,
        )  # fmt: skip
        start = time.perf_counter()
        with torch.no_grad():
            gens = generate(model, tok, [prompt] * batch, cfg, tags, response_prefixes=[forced] * batch)
        wall = time.perf_counter() - start
        tokens = sum(len(g.token_ids) for g in gens)
        speed[mode] = tokens / wall
        forks = sum(g.parallel_taken for g in gens)
        out.append((f"decode {mode}, {batch} x {new_tokens} new tokens", f"{speed[mode]:.0f} tokens/s", "",
                    f"{tokens} tokens in {wall:.1f} s; forked {forks}/{batch}"))  # fmt: skip
    out.append(
        (
            "decode parallel / sequential",
            f"{speed['parallel'] / speed['sequential']:.2f}x",
            "",
            "tokens/s ratio",
        )
    )
    return out


def parallel_example(tok, tags, length: int, filler_text: str = " 1"):
    """One parallel-format row of ``length`` tokens (plans, branches, takeaway) for the SFT step."""
    from components.training.sft_data import SFTExample

    head = tok.encode("<guideline><plan>1: a</plan><plan>2: b</plan></guideline>", add_special_tokens=False)
    step_open, step_close = tok.convert_tokens_to_ids("<step>"), tok.convert_tokens_to_ids("</step>")
    take_open, take_close = tok.convert_tokens_to_ids("<takeaway>"), tok.convert_tokens_to_ids("</takeaway>")
    prompt = tok.encode("solve", add_special_tokens=False)
    filler = tok.encode(filler_text, add_special_tokens=False)
    branch = max(4, (length - len(prompt) - len(head) - 8) // 3)
    ids = prompt + head
    for label in ("1:", "2:"):
        ids += [step_open] + tok.encode(label, add_special_tokens=False) + filler * branch + [step_close]
    ids += [take_open] + filler * branch + [take_close, tok.eos_token_id]
    return SFTExample(tuple(ids), len(prompt), 0)


def training_rows(model, tok, tags, shape_name: str, seq_len: int, device: torch.device) -> list[Row]:
    from components.training import memory
    from components.training.memory_probe import measure
    from components.training.rl import RLTrainer
    from components.training.rl_batch import Rollout
    from components.training.sft import SFTSettings, _train_step, build_optimizer, build_scheduler

    w = 4 if next(model.parameters()).dtype == torch.float32 else 2
    shape = memory.ModelShape.from_hf_config(model.config)
    rows: list[Row] = []
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    settings = SFTSettings(mode="parallel", total_steps=1, batch_size=1, lr=1e-6, gradient_checkpointing=True)
    example = parallel_example(tok, tags, seq_len)
    with measure(device) as reading:
        optimizer = build_optimizer(model, settings)
        start = time.perf_counter()
        record = _train_step(
            model,
            optimizer,
            build_scheduler(optimizer, settings),
            [example],
            settings,
            tok.pad_token_id,
            tags,
        )
        wall = time.perf_counter() - start
    plan = memory.training_state_terms(shape, w) + memory.training_activation_terms(
        shape, memory.ForwardShape(1, len(example.input_ids), True), w, True, "parallel_warmup"
    )
    planned = sum(t.bytes for t in plan) - shape.params * w  # the weights existed before the step
    rows.append((f"parallel-mask SFT step ({shape_name}, {len(example.input_ids)} tokens)",
                 f"{wall:.2f} s, peak {_fmt_gib(reading.peak_bytes)}", _fmt_gib(planned),
                 f"measured/planned {reading.peak_bytes / planned:.2f}; loss {record['loss']:.2f}"))  # fmt: skip
    del optimizer
    # one PAPO update on parallel rollouts (the rollout text is the SFT example's layout)
    from components.config import load_config

    cfg = load_config(
        ROOT / "configs" / "tiny.yaml",
        overrides=["papo_rl.lr=1e-7", "papo_rl.micro_batch_size=1"],
        root=ROOT,  # the script runs from its --out folder; the prompts live in the checkout
    )
    problems = [{"id": "p", "problem": "x", "answer": "1"}]
    trainer = RLTrainer(
        "papo_rl", cfg, model, tok, problems, problems, Path(tempfile.mkdtemp(prefix="npr-smoke-rl-"))
    )
    other = parallel_example(tok, tags, seq_len, " 2")  # a different response: the advantages do not cancel
    rollouts = [
        Rollout(group_id="g", problem_id="p", answer="1", prompt_ids=list(ex.input_ids[: ex.n_prompt]),
                response_ids=list(ex.input_ids[ex.n_prompt :]), text="", finish_reason="stop",
                parallel_taken=True, reward=r)
        for ex, r in ((example, 1.0), (other, -1.0))
    ]  # fmt: skip
    with measure(device) as reading:
        start = time.perf_counter()
        stats = trainer._update([rollouts], __import__("collections").Counter())
        wall = time.perf_counter() - start
    fwd = memory.ForwardShape(1, len(example.input_ids), True, scored=len(rollouts[0].response_ids))
    plan = memory.training_state_terms(shape, w) + memory.training_activation_terms(
        shape, fwd, w, True, "papo_rl"
    )
    planned = sum(t.bytes for t in plan) - shape.params * w
    rows.append((f"PAPO update ({shape_name}, 2 rollouts x {len(example.input_ids)} tokens)",
                 f"{wall:.2f} s, peak {_fmt_gib(reading.peak_bytes)}", _fmt_gib(planned),
                 f"measured/planned {reading.peak_bytes / planned:.2f}; grad norm {stats['actor/grad_norm']:.3g}"))  # fmt: skip
    return rows


def shaped_model_rows(device: torch.device, cpu: bool) -> list[Row]:
    from components.models.tags import add_tag_tokens
    from components.models.tiny import tiny_test_world
    from components.parallel import TagIds

    shape = SMALL if cpu else QWEN3_4B
    name = "Qwen3-4B shape" if not cpu else "small Qwen3"
    dtype = torch.float32 if cpu else torch.bfloat16
    _, tok = tiny_test_world(seed=0)  # a tokenizer with the NPR tags; the model's vocabulary is larger
    model = build_model(shape, device, dtype)
    add_tag_tokens(model, tok, "npr")
    tags = TagIds.from_tokenizer(tok, "npr")
    new_tokens, batch, seq = (256, 4, 512) if cpu else (4096, 8, 4096)
    rows = [
        (f"{name}: parameters", f"{sum(p.numel() for p in model.parameters()) / 1e9:.3f} B", "", str(shape))
    ]
    model.eval()
    rows += decode_rows(model, tok, tags, new_tokens, batch)
    model.train()
    rows += training_rows(model, tok, tags, name, seq, device)
    return rows


def print_table(rows: list[Row], device: str) -> str:
    lines = [f"device: {device}", "", "| what | measured | planner | note |", "|---|---|---|---|"]
    lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows]
    text = "\n".join(lines)
    print(text)
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="run on CPU with small shapes")
    parser.add_argument("--out", type=Path, help="also write the table (markdown) and rows (json) here")
    parser.add_argument(
        "--stages",
        default=",".join(STAGES),
        help="the first stages of part 1 to run (a prefix of the chain; '' for none)",
    )
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("WANDB_MODE", "offline")
    os.environ.setdefault("WANDB_SILENT", "true")
    if args.cpu:
        device = torch.device("cpu")
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    elif torch.cuda.is_available():
        device = torch.device("cuda", 0)
    else:
        parser.error("no CUDA device: run with --cpu")
    started = time.perf_counter()
    rows: list[Row] = []
    stages = [x for x in args.stages.split(",") if x]
    if stages != STAGES[: len(stages)]:
        parser.error(f"--stages must be a prefix of {','.join(STAGES)}")
    if stages:
        rows += run_tiny_stages(device, args.cpu, stages)
    rows += shaped_model_rows(device, args.cpu)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    rows.append(("total wall time", f"{time.perf_counter() - started:.0f} s", "", ""))
    text = print_table(rows, name)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "smoke.md").write_text(text + "\n")
        (args.out / "smoke.json").write_text(json.dumps([list(r) for r in rows], indent=1))
    with contextlib.suppress(Exception):
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
