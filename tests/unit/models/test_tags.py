"""add_tag_tokens: tags become single ids, new rows are the mean of the tag name's sub-token rows."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

from components.models.tags import add_tag_tokens, tag_name_subtoken_ids
from components.structure import get_schema

NPR_TAGS = get_schema("npr").tags


def _untied_model(vocab_size: int) -> Qwen3ForCausalLM:
    torch.manual_seed(0)
    cfg = Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        tie_word_embeddings=False,
    )
    return Qwen3ForCausalLM(cfg)


def test_qwen_style_tokenizer_gets_single_tags_and_mean_rows(qwen_style_tokenizer_dir):
    tokenizer = AutoTokenizer.from_pretrained(qwen_style_tokenizer_dir)
    assert len(tokenizer.encode("</takeaway>", add_special_tokens=False)) > 1  # multi-token before
    model = _untied_model(len(tokenizer))
    in_before = model.get_input_embeddings().weight.detach().clone()
    out_before = model.get_output_embeddings().weight.detach().clone()
    sub_ids = {tag: tag_name_subtoken_ids(tokenizer, tag) for tag in NPR_TAGS}
    assert tokenizer.convert_ids_to_tokens(sub_ids["</plan>"])[0].startswith("/")  # "/plan": name without <>

    ids = add_tag_tokens(model, tokenizer, "npr", pad_to_multiple_of=64)

    assert list(ids) == list(NPR_TAGS)
    for tag, token_id in ids.items():
        assert tokenizer.encode(tag, add_special_tokens=False) == [token_id]
        expected_in = in_before[sub_ids[tag]].mean(dim=0)
        expected_out = out_before[sub_ids[tag]].mean(dim=0)
        torch.testing.assert_close(model.get_input_embeddings().weight[token_id], expected_in, rtol=0, atol=0)
        torch.testing.assert_close(
            model.get_output_embeddings().weight[token_id], expected_out, rtol=0, atol=0
        )
    rows = model.get_input_embeddings().weight.shape[0]
    assert rows % 64 == 0 and rows >= len(tokenizer)
    # old rows untouched; the Qwen pad token kept; decoding keeps the tags as text
    torch.testing.assert_close(model.get_input_embeddings().weight[: in_before.shape[0]], in_before)
    assert tokenizer.pad_token == "<|endoftext|>" and model.config.pad_token_id == tokenizer.pad_token_id
    text = "<guideline><plan>1: plan</plan></guideline>"
    assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text


def test_second_call_changes_nothing(qwen_style_tokenizer_dir):
    tokenizer = AutoTokenizer.from_pretrained(qwen_style_tokenizer_dir)
    model = _untied_model(len(tokenizer))
    first = add_tag_tokens(model, tokenizer, "npr", pad_to_multiple_of=64)
    weights = copy.deepcopy(model.state_dict())
    n_tokens = len(tokenizer)
    assert add_tag_tokens(model, tokenizer, "npr", pad_to_multiple_of=64) == first
    assert len(tokenizer) == n_tokens
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, weights[name]), name


def test_tiny_tokenizer_already_has_tags(world):
    model, tokenizer = world
    before = model.get_input_embeddings().weight.detach().clone()
    ids = add_tag_tokens(model, tokenizer, "npr", pad_to_multiple_of=64)
    assert ids == {tag: tokenizer.convert_tokens_to_ids(tag) for tag in NPR_TAGS}
    assert torch.equal(model.get_input_embeddings().weight, before)


def test_tokenizer_without_pad_gets_fim_pad(qwen_style_tokenizer_dir):
    tokenizer = AutoTokenizer.from_pretrained(qwen_style_tokenizer_dir)
    tokenizer.pad_token = None
    model = _untied_model(len(tokenizer))
    add_tag_tokens(model, tokenizer, "npr")
    assert tokenizer.pad_token == "<|fim_pad|>"
    assert model.config.pad_token_id == tokenizer.convert_tokens_to_ids("<|fim_pad|>")


def test_unknown_schema_is_a_clear_error(world):
    model, tokenizer = world
    with pytest.raises(ValueError, match="unknown structure schema"):
        add_tag_tokens(model, tokenizer, "nope")
