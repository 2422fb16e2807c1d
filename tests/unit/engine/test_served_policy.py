"""The weights a served policy hands vLLM: an untied copy of a tied checkpoint computes the same function, and
every update carries the output layer (the server-side behaviour: tests/integration/engine/test_vllm_weight_sync.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from components.engine.served_policy import EMBEDDINGS, OUTPUT_LAYER, is_tied, served_state, untied_copy
from components.models.loading import save_model
from components.models.tiny import tiny_test_world


def test_a_tied_models_state_gets_its_embeddings_as_output_layer() -> None:
    emb = torch.randn(6, 4)
    out = served_state({EMBEDDINGS: emb, "model.norm.weight": torch.ones(4)}, tied=True)
    assert torch.equal(out[OUTPUT_LAYER], emb) and out[OUTPUT_LAYER].data_ptr() != emb.data_ptr()
    # the trainer may send the tied parameter under both names: the output layer is still the embeddings
    out = served_state({EMBEDDINGS: emb, OUTPUT_LAYER: emb}, tied=True)
    assert torch.equal(out[OUTPUT_LAYER], emb)
    with pytest.raises(KeyError, match="without model.embed_tokens.weight"):
        served_state({"model.norm.weight": torch.ones(4)}, tied=True)
    with pytest.raises(KeyError, match="output layer would not reload"):
        served_state({EMBEDDINGS: emb}, tied=False)


def test_the_untied_copy_computes_what_the_tied_checkpoint_does(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM  # lazy: a model load, this test only

    model, tok = tiny_test_world(seed=0)
    tied = save_model(model, tok, tmp_path / "tied")
    assert is_tied(tied) and OUTPUT_LAYER not in load_file(str(tied / "model.safetensors"))
    copy = untied_copy(tied, tmp_path / "untied")
    assert not is_tied(copy) and json.loads((copy / "config.json").read_text())["tie_word_embeddings"] is False
    weights = load_file(str(copy / "model.safetensors"))
    assert torch.equal(weights[OUTPUT_LAYER], weights[EMBEDDINGS])
    ids = torch.tensor([[5, 9, 11, 3, 7]])
    with torch.no_grad():
        a = AutoModelForCausalLM.from_pretrained(tied).eval()(ids).logits
        b = AutoModelForCausalLM.from_pretrained(copy).eval()(ids).logits
    assert torch.equal(a, b)
    assert untied_copy(copy, tmp_path / "again") == copy  # an untied checkpoint is served as it is
