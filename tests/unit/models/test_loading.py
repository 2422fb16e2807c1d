"""save_model -> load_model round trip: same weights, same logits, same tokenizer and chat template."""

from __future__ import annotations

import pytest
import torch

from components.models.config import ModelsConfig
from components.models.loading import ModelLoadError, load_model, save_model
from components.settings import RunConfig


def test_round_trip_identical_logits(world, tmp_path):
    model, tokenizer = world
    save_model(model, tokenizer, tmp_path / "m")
    assert (tmp_path / "m" / "model.safetensors").exists()
    loaded, loaded_tok = load_model(tmp_path / "m", ModelsConfig(), RunConfig())
    ids = torch.tensor([tokenizer.encode("<guideline><plan>1: compute 3 + 4</plan></guideline>")])
    with torch.no_grad():
        expected = model(ids).logits
        got = loaded(ids).logits
    assert torch.equal(expected, got)
    assert not loaded.training and loaded.config._attn_implementation == "sdpa"
    assert loaded_tok.get_vocab() == tokenizer.get_vocab()
    messages = [{"role": "user", "content": "Compute (1 + 2) - (3 + 4)."}]
    assert loaded_tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == (
        tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    )


def test_for_training_and_attention_from_config(world, tmp_path):
    model, tokenizer = world
    save_model(model, tokenizer, tmp_path / "m")
    loaded, _ = load_model(
        tmp_path / "m", ModelsConfig(attn_implementation="eager"), RunConfig(), for_training=True
    )
    assert loaded.training and loaded.config.use_cache is False
    assert loaded.config._attn_implementation == "eager"
    assert (tmp_path / "m" / "config.json").read_text().count('"use_cache": true') == 1


def test_bfloat16_from_run_config(world, tmp_path):
    model, tokenizer = world
    save_model(model, tokenizer, tmp_path / "m")
    loaded, _ = load_model(tmp_path / "m", ModelsConfig(), RunConfig(dtype="bfloat16"))
    assert next(loaded.parameters()).dtype == torch.bfloat16


def test_missing_directory_is_a_clear_error(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_model(tmp_path / "absent", ModelsConfig(), RunConfig())
