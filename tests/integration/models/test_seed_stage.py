"""Stage `seed`: materialising the committed tiny instruct checkpoint, refusing a corrupted copy, and the
from-scratch build path (``models.base_model: tiny``) on a few steps."""

from __future__ import annotations

import json
import shutil

import pytest

from components.artifacts import write_json, write_shards
from components.config import load_config
from components.dag import StageIO
from components.data import synthetic
from components.models.loading import load_model
from components.stages import apply_run_settings
from components.stages.seed import run
from components.training.tiny_seed import CHECKSUMS_FILE, read_card

pytestmark = pytest.mark.slow


def _problems_dir(root, n):
    val = [dict(r, split="val") for r in synthetic.generate_problems(n, 999, None, partitions=("val",))]
    test = [dict(r, split="test") for r in synthetic.generate_problems(n, 998, None, partitions=("test",))]
    write_shards(root / "problems", val, 1, stem="val")
    write_shards(root / "problems", test, 1, stem="test")
    write_json(root / "problems" / "manifest.json", {"counts": {"train": 0, "val": n, "test": n}})
    return val


def _run_seed(tmp_path, overrides, n=16):
    cfg = load_config(profile="tiny", overrides=[f"seed.eval_n={n}", "grading.workers=1", *overrides])
    val = _problems_dir(tmp_path, n)
    io = StageIO(
        stage="seed",
        inputs={"sample_orz/problems": tmp_path / "problems"},
        outputs={"model": tmp_path / "seed" / "model"},
    )
    apply_run_settings(cfg)
    return cfg, io, val, run(cfg, io)


def test_seed_materialises_the_committed_checkpoint_and_measures_it_on_val(tmp_path, in_repo):
    cfg, io, _, metrics = _run_seed(tmp_path, [])
    committed = in_repo / cfg.models.base_model
    assert metrics["base_model"] == "models/tiny-instruct"
    assert set(metrics["checksums_verified"]) >= {"model.safetensors", "tokenizer.json", "config.json"}
    assert metrics["card_weights_sha256"] == read_card(committed)["weights_sha256"]
    assert metrics["eval_split"] == "val" and metrics["eval_n"] == 16
    for key in ("format_valid", "accuracy", "correct_and_valid"):
        assert 0.0 <= metrics[key] <= 1.0
    model, tokenizer = load_model(io.output("model"), cfg.models, cfg.run)
    assert sum(p.numel() for p in model.parameters()) == metrics["parameters"]
    for tag in ("<guideline>", "</takeaway>", "<|im_end|>"):
        assert len(tokenizer.encode(tag, add_special_tokens=False)) == 1


def test_seed_refuses_a_corrupted_or_missing_checkpoint(tmp_path, in_repo):
    copy = tmp_path / "copy"
    shutil.copytree(in_repo / "models" / "tiny-instruct", copy)
    (copy / "tokenizer.json").write_text(json.dumps({"truncated": True}))
    with pytest.raises(ValueError, match=f"tokenizer.json has sha256 .* {CHECKSUMS_FILE} says"):
        _run_seed(tmp_path, [f"models.base_model={copy}"])
    with pytest.raises(FileNotFoundError, match="does not exist"):
        _run_seed(tmp_path / "b", ["models.base_model=models/no-such-model"])


def test_seed_builds_from_scratch_when_asked(tmp_path, in_repo):
    overrides = [
        "models.base_model=tiny",
        "seed.steps=3",
        "seed.batch_size=4",
        "seed.warmup_steps=1",
        "seed.save_every=2",
        "models.tiny.tokenizer_corpus_size=300",
    ]
    cfg, io, _, metrics = _run_seed(tmp_path, overrides, n=4)
    assert metrics["base_model"] == "tiny" and metrics["steps"] == 3
    history = json.loads((tmp_path / "seed" / "work" / "train_metrics.json").read_text())["history"]
    assert [h["step"] for h in history] == [1, 3]
    model, _ = load_model(io.output("model"), cfg.models, cfg.run)
    assert model.get_input_embeddings().weight.shape[0] % cfg.models.pad_embeddings_to_multiple_of == 0


@pytest.mark.slow
def test_the_seed_stage_run_twice_is_bit_identical(tmp_path):
    # same machine, same torch thread count: every byte of the model and tokenizer, and every metric but
    # the wall times (docs/architecture.md, "Reproducibility")
    overrides = [
        "models.base_model=tiny",
        "seed.steps=6",
        "seed.batch_size=8",
        "seed.eval_n=8",
        "seed.save_every=3",
        "seed.warmup_steps=1",
        "models.tiny.tokenizer_corpus_size=1000",
    ]
    runs = [_run_seed(tmp_path / name, overrides) for name in ("a", "b")]
    files = [
        sorted(p.relative_to(io.output("model")) for p in io.output("model").rglob("*"))
        for _, io, _, _ in runs
    ]
    assert files[0] == files[1] and any(str(f) == "model.safetensors" for f in files[0])
    for rel in files[0]:
        a, b = (runs[i][1].output("model") / rel for i in (0, 1))
        if a.is_file():
            assert a.read_bytes() == b.read_bytes(), f"{rel} differs between two runs"
    untimed = [{k: v for k, v in m.items() if "wall_time" not in k and k != "steps_per_s"} for *_, m in runs]
    assert untimed[0] == untimed[1]


def test_qwen3_4b_seed_materialises_on_a_worker_without_cuda(tmp_path, in_repo, monkeypatch):
    """qwen3-4b runs seed on the cpu pool (not in orchestration.gpu_stages) with run.device cuda: the copy
    must not need CUDA; its measurement, when asked for, still does and says so."""
    import torch

    from components.models.loading import ModelLoadError

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # a cpu-pool worker, on any machine
    local = tmp_path / "base"
    shutil.copytree(in_repo / "models" / "tiny-instruct", local)
    cfg = load_config(profile="qwen3-4b", overrides=[f"models.base_model={local}"])
    assert "seed" not in cfg.orchestration.gpu_stages and cfg.run.device == "cuda" and cfg.seed.eval_n == 0
    _problems_dir(tmp_path, 4)
    io = StageIO(
        stage="seed",
        inputs={"sample_orz/problems": tmp_path / "problems"},
        outputs={"model": tmp_path / "seed" / "model"},
    )
    metrics = run(cfg, io)
    assert metrics["base_model"] == str(local) and (tmp_path / "seed" / "model" / "model.safetensors").exists()
    measured = cfg.model_copy(update={"seed": cfg.seed.model_copy(update={"eval_n": 4})})
    with pytest.raises(ModelLoadError, match="no CUDA device"):
        run(measured, StageIO(stage="seed", inputs=io.inputs, outputs={"model": tmp_path / "m2" / "model"}))
