"""The SFT recipe: loss goes down, parallel loss = sum of isolated branch losses, data rejections recorded."""

from __future__ import annotations

import random

import pytest
import torch
from transformers import DynamicCache

from components.data import synthetic
from components.prompts import PromptConfig
from components.structure import TagIds
from components.training.sft import SFTSettings, token_nll, train_sft
from components.training.sft_data import collate, encode_example, parents_from_mask, prepare_examples

PROMPTS = PromptConfig(
    parallel_instruction="prompts/tiny_parallel_v1.txt",
    sequential_instruction="prompts/tiny_sequential_v1.txt",
)


@pytest.fixture(scope="module")
def world():
    from components.models.tiny import tiny_test_world

    return tiny_test_world(seed=0)


def _examples(tokenizer, n, style, seed=0):
    rng = random.Random(seed)
    out = []
    for i, rec in enumerate(synthetic.generate_problems(n, seed, {"easy": 1.0})):
        prompt = tokenizer.apply_chat_template(
            [{"role": "user", "content": rec["problem"]}], tokenize=False, add_generation_prompt=True
        )
        out.append(encode_example(tokenizer, prompt, synthetic.render_solution(rec, style, rng), i))
    return out


def test_few_steps_lower_the_loss_on_a_fixed_batch(world, tmp_path):
    model, tokenizer = world
    model = type(model)(model.config)  # fresh copy: module-scoped world stays untouched
    model.load_state_dict(world[0].state_dict())
    tags = TagIds.from_tokenizer(tokenizer, "npr")
    batch_examples = _examples(tokenizer, 8, "parallel")
    batch = collate(batch_examples, "parallel", tokenizer.pad_token_id, tags)
    with torch.no_grad():
        before = token_nll(model, batch)[0].item() / batch.n_loss_tokens
    settings = SFTSettings(mode="parallel", total_steps=8, batch_size=8, lr=3e-3, scheduler="constant")
    result = train_sft(
        model,
        lambda step: batch_examples,
        settings,
        tmp_path,
        pad_id=tokenizer.pad_token_id,
        tags=tags,
        show_progress=False,
    )
    with torch.no_grad():
        after = token_nll(model, batch)[0].item() / batch.n_loss_tokens
    assert result.final_step == 8
    assert after < 0.7 * before, (before, after)


def _isolated_nll(model, ids, positions, n_prompt, tags):
    """Sum of NLLs computed branch by branch: prefix run, one causal run per step (prefix + that step, same
    positions), then the tail decoded over a KV cache made of the prefix and every step's keys/values."""
    anchor = ids.index(tags.ids["</guideline>"])
    opens = [i for i, t in enumerate(ids) if t == tags.ids["<step>"]]
    closes = [i for i, t in enumerate(ids) if t == tags.ids["</step>"]]
    merge = ids.index(tags.ids["<takeaway>"])
    assert merge == closes[-1] + 1 and opens[0] == anchor + 1  # canonical layout

    def run(seq, pos, cache=None):
        out = model(
            torch.tensor([seq]), position_ids=torch.tensor([pos]), past_key_values=cache, use_cache=True
        )
        return torch.log_softmax(out.logits[0].double(), -1), out.past_key_values

    total = 0.0
    logp, _ = run(ids[: anchor + 1], positions[: anchor + 1])
    total += -sum(logp[t - 1, ids[t]] for t in range(n_prompt, anchor + 1))
    branch_caches, last_logp = [], None
    for s, e in zip(opens, closes, strict=True):
        seq = ids[: anchor + 1] + ids[s : e + 1]
        pos = positions[: anchor + 1] + positions[s : e + 1]
        logp, cache = run(seq, pos)
        total += -sum(logp[t - 1, seq[t]] for t in range(anchor + 1, len(seq)))
        branch_caches.append(cache)
        last_logp = logp[-1]
    merged = DynamicCache(config=model.config)
    for layer in range(model.config.num_hidden_layers):
        keys = [branch_caches[0].layers[layer].keys[:, :, : anchor + 1]]
        values = [branch_caches[0].layers[layer].values[:, :, : anchor + 1]]
        for c in branch_caches:
            keys.append(c.layers[layer].keys[:, :, anchor + 1 :])
            values.append(c.layers[layer].values[:, :, anchor + 1 :])
        merged.update(torch.cat(keys, dim=2), torch.cat(values, dim=2), layer)
    total += -last_logp[ids[merge]]
    logp, _ = run(ids[merge:], positions[merge:], merged)
    total += -sum(logp[k - 1, ids[merge + k]] for k in range(1, len(ids) - merge))
    return float(total)


def test_parallel_loss_equals_sum_of_isolated_branches(world):
    model, tokenizer = world
    tags = TagIds.from_tokenizer(tokenizer, "npr")
    record = synthetic.generate_problems(1, 3, {"medium": 1.0})[0]  # 4 brackets -> 4 branches
    example = _examples(tokenizer, 1, "parallel")[0]
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": record["problem"]}], tokenize=False, add_generation_prompt=True
    )
    example = encode_example(
        tokenizer, prompt, synthetic.render_solution(record, "parallel", random.Random(1))
    )
    batch = collate([example], "parallel", tokenizer.pad_token_id, tags)
    with torch.no_grad():
        parallel_sum, n = token_nll(model, batch)
        isolated = _isolated_nll(
            model, list(example.input_ids), batch.position_ids[0].tolist(), example.n_prompt, tags
        )
    assert n == example.n_response
    assert abs(parallel_sum.item() - isolated) < 1e-4, (parallel_sum.item(), isolated)


def test_sequential_parents_are_previous_tokens_and_parallel_parents_skip_siblings(world):
    _, tokenizer = world
    tags = TagIds.from_tokenizer(tokenizer, "npr")
    example = _examples(tokenizer, 1, "parallel")[0]
    ids = list(example.input_ids)
    par = collate([example], "parallel", tokenizer.pad_token_id, tags)
    seq = collate([example], "sequential", tokenizer.pad_token_id)
    assert seq.parents[0].tolist()[1:] == list(range(len(ids) - 1))
    step_starts = [i for i, t in enumerate(ids) if t == tags.ids["<step>"]]
    assert len(step_starts) >= 2
    # every step after the first opens from </guideline>, not from its sibling's </step>; nothing else moves
    assert all(par.parents[0, i] == ids.index(tags.ids["</guideline>"]) for i in step_starts[1:])
    changed = (par.parents[0] != seq.parents[0]).nonzero().flatten().tolist()
    assert changed == step_starts[1:]
    assert parents_from_mask(torch.ones(1, 1, 3, 3, dtype=torch.bool).tril()).tolist() == [[0, 0, 1]]


def test_prepare_examples_records_every_rejection(world):
    _, tokenizer = world
    rng = random.Random(0)
    recs = synthetic.generate_problems(4, 0, {"easy": 1.0})
    good = synthetic.render_solution(recs[0], "parallel", rng)
    records = [
        {"problem_id": "ok", "problem": recs[0]["problem"], "response": good},
        {
            "problem_id": "bad",
            "problem": recs[1]["problem"],
            "response": synthetic.render_solution(recs[1], "parallel", rng, "unclosed_step"),
        },
        {
            "problem_id": "long",
            "problem": recs[2]["problem"] * 20,
            "response": synthetic.render_solution(recs[2], "parallel", rng),
        },
        {"problem_id": "empty", "problem": recs[3]["problem"]},
        {
            "problem_id": "gap",
            "problem": recs[0]["problem"],
            "response": good.replace("</guideline>", "</guideline>\n"),
        },
    ]
    data = prepare_examples(
        records,
        tokenizer,
        PROMPTS,
        mode="parallel",
        prompt_style="parallel",
        schema_name="npr",
        max_length=320,
    )
    summary = data.summary()
    assert summary["n_records"] == 5 and summary["n_examples"] == 2 and summary["n_rejected"] == 3
    assert summary["n_normalized"] == 1
    reasons = {r.record_id: r.reason for r in data.rejections}
    assert reasons["long"] == "over_length" and reasons["empty"] == "missing_field"
    assert reasons["bad"].startswith("structure:")
    # the normalised record tokenises exactly like the canonical one
    assert data.examples[0].input_ids == data.examples[1].input_ids
    seq = prepare_examples(
        records,
        tokenizer,
        PROMPTS,
        mode="sequential",
        prompt_style="parallel",
        schema_name="npr",
        max_length=320,
    )
    assert seq.summary()["n_examples"] == 3  # causal mode trains the malformed trace as text


def test_settings_from_stage_config():
    from components.training.config import SFTStageConfig

    cfg = SFTStageConfig(batch_size=4, grad_accum=2, epochs=3, warmup_ratio=0.1)
    s = SFTSettings.from_stage_config(cfg, n_examples=20)
    assert s.total_steps == 8 and s.warmup_steps == 1 and s.examples_per_step == 8
    assert SFTSettings.from_stage_config(cfg.model_copy(update={"max_steps": 5}), 20).total_steps == 5


@pytest.mark.parametrize("mode", ["sequential", "parallel"])
def test_length_splits_take_the_same_step_as_one_pass(world, mode):
    from components.training.sft import _train_step

    model, tokenizer = world
    tags = TagIds.from_tokenizer(tokenizer, "npr") if mode == "parallel" else None
    examples = _examples(tokenizer, 8, mode, seed=3)
    assert len({len(e.input_ids) for e in examples}) > 1
    deltas, records = [], []
    for splits in (1, 3):
        copy = type(model)(model.config)
        copy.load_state_dict(model.state_dict())
        # plain SGD at lr 1: the weight change is the gradient itself
        optimizer = torch.optim.SGD(copy.parameters(), lr=1.0)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
        settings = SFTSettings(
            mode=mode, total_steps=1, batch_size=8, lr=1.0, grad_clip=1e9, length_splits=splits
        )
        records.append(
            _train_step(copy, optimizer, scheduler, examples, settings, tokenizer.pad_token_id, tags)
        )
        deltas.append({k: v - model.state_dict()[k] for k, v in copy.state_dict().items()})
    assert records[0]["loss_tokens"] == records[1]["loss_tokens"]
    assert records[1]["loss"] == pytest.approx(records[0]["loss"], rel=1e-5)
    assert records[1]["tokens"] == records[0]["tokens"]
    assert records[1]["padded_tokens"] < records[0]["padded_tokens"]  # what the splits are for
    for key, delta in deltas[0].items():
        scale = float(delta.abs().max())
        torch.testing.assert_close(deltas[1][key], delta, rtol=0, atol=1e-4 * scale + 1e-10, msg=key)


class _CountingSource:
    """A step source that counts what it served (as the seed's skips held-out problems), and can crash."""

    def __init__(self, examples, crash_at=None) -> None:
        self.examples, self.crash_at, self.served = examples, crash_at, 0

    def __call__(self, step):
        if step == self.crash_at:
            raise RuntimeError("killed")
        self.served += 1
        return self.examples

    def state_dict(self):
        return {"served": self.served}

    def load_state_dict(self, state):
        self.served = state["served"]


def test_a_resumed_run_reports_the_totals_of_an_uninterrupted_one(world, tmp_path):
    model0, tokenizer = world
    examples = _examples(tokenizer, 2, "sequential")
    settings = SFTSettings(mode="sequential", total_steps=4, batch_size=2, lr=1e-3, save_every=2, log_every=1)

    def fresh():
        model = type(model0)(model0.config)
        model.load_state_dict(model0.state_dict())
        return model

    def run(work, source):
        return train_sft(
            fresh(), source, settings, work, pad_id=tokenizer.pad_token_id, show_progress=False,
            metrics_path=work / "train_metrics.json",
        )  # fmt: skip

    full_source = _CountingSource(examples)
    full = run(tmp_path / "full", full_source)
    with pytest.raises(RuntimeError, match="killed"):
        run(tmp_path / "cut", _CountingSource(examples, crash_at=3))  # after the step-2 checkpoint
    source = _CountingSource(examples)
    resumed = run(tmp_path / "cut", source)
    assert resumed.start_step == 2 and source.served == full_source.served == 4
    assert resumed.train_tokens == full.train_tokens
    untimed = [
        [{k: v for k, v in h.items() if k != "step_time_s"} for h in r.history] for r in (full, resumed)
    ]
    assert untimed[0] == untimed[1]
    assert resumed.wall_time_s > 0, "the training time of the steps before the resume is counted"
