"""Pieces of the tiny seed build that need no trained model: its data, checksums, card and measurement."""

from __future__ import annotations

import json

import pytest

from components.config import load_config
from components.data import synthetic
from components.models.tiny import tiny_test_world
from components.training import tiny_seed
from components.training.seed_job import seed_job


@pytest.fixture(scope="module")
def cfg():
    return load_config(profile="tiny", overrides=["seed.batch_size=48", "grading.workers=1"])


def test_seed_examples_are_train_partition_both_styles_and_fit(cfg):
    _, tokenizer = tiny_test_world(seed=0)
    source = tiny_seed.SeedSource(seed_job(None, cfg), tokenizer)
    examples = source(0)
    assert len(examples) == 48 and examples == source(0)  # a pure function of the step
    assert all(len(e.input_ids) <= cfg.seed.max_length for e in examples)
    texts = [tokenizer.decode(e.input_ids[e.n_prompt :]) for e in examples]
    parallel = sum(t.startswith("<guideline>") for t in texts)
    assert 0 < parallel < len(texts)  # both styles, mostly sequential (parallel_fraction 0.3)
    for step in range(4):
        for rec in tiny_seed.training_problems(32, step, cfg.seed.difficulty_weights):
            assert synthetic.partition(rec["id"]) == "train"


def test_checksums_catch_a_changed_or_missing_file(tmp_path):
    (tmp_path / "a.bin").write_bytes(b"weights")
    (tmp_path / "b.json").write_text("{}")
    sums = tiny_seed.write_checksums(tmp_path)
    assert set(sums) == {"a.bin", "b.json"}
    assert tiny_seed.verify_checksums(tmp_path) == sums
    (tmp_path / "a.bin").write_bytes(b"version https://git-lfs.github.com/spec/v1\n")
    with pytest.raises(ValueError, match="a.bin has sha256"):
        tiny_seed.verify_checksums(tmp_path)
    (tmp_path / "a.bin").unlink()
    with pytest.raises(ValueError, match="missing"):
        tiny_seed.verify_checksums(tmp_path)
    assert tiny_seed.verify_checksums(tmp_path / "nowhere") is None


def test_measure_reports_styles_and_levels_and_the_card_renders(cfg):
    model, tokenizer = tiny_test_world(seed=0)
    problems = tiny_seed.validation_problems(6, {"easy": 1, "hard": 1})
    m = tiny_seed.measure(model, tokenizer, problems, seed_job(None, cfg), temperature=1.0, max_new_tokens=8)
    assert m["n"] == 6 and set(m["per_difficulty"]) == {"easy", "hard"}
    assert len(m["correct"]) == 6 and m["truncated"] == 1.0  # 8 tokens never finish an answer
    card = {
        "parameters": 123,
        "vocab_size": 300,
        "config": {"seed": cfg.seed.model_dump(mode="json"), "run.seed": 0},
        "data": {"partition": {"rule": "r", "reserved": {"0": "test"}}},
        "environment": {"torch": "x", "torch_threads": 1},
        "training": {"train_wall_time_s": 10.0, "final_loss": 0.5},
        "validation": {
            "sampled_t1": {k: v for k, v in m.items() if k != "correct"},
            "greedy": {"n": 6, "accuracy": 0.5, "format_valid": 0.5},
        },
    }
    text = tiny_seed.render_card(card)
    assert text.startswith("---\nlibrary_name: transformers") and "| all | 6 |" in text
    json.dumps(card)  # the machine-readable card is plain JSON
