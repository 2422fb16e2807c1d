"""The tiny tokenizer: one digit per token (space attached), atomic specials, a corpus rendered as chats."""

from __future__ import annotations

import pytest

from components.models.tiny import CHAT_TOKENS, render_chat, train_tokenizer
from components.structure import get_schema

CONVERSATIONS = [
    render_chat(
        [
            {"role": "user", "content": f"Compute ({a} + {b}) - ({b} * {a}). Use <guideline> and \\boxed{{}}."},
            {"role": "assistant", "content": f"<step>1: {a} + {b} = {a + b}</step> The answer is \\boxed{{{a + b}}}."},
        ]
    )
    for a in range(1, 10)
    for b in range(1, 10)
] * 20


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(CONVERSATIONS, 512, "npr")


def _pieces(tokenizer, text: str) -> list[str]:
    return [tokenizer.decode([i]) for i in tokenizer.encode(text, add_special_tokens=False)]


def test_numbers_cost_one_token_per_digit_with_the_space_attached(tokenizer):
    assert _pieces(tokenizer, " = 40") == [" =", " 4", "0"]
    assert _pieces(tokenizer, "(7 + 3)") == ["(", "7", " +", " 3", ")"]


def test_role_headers_are_single_tokens(tokenizer):
    assert _pieces(tokenizer, "user") == ["user"]
    assert _pieces(tokenizer, "assistant") == ["assistant"]


def test_specials_are_single_ids_and_never_inside_a_merge(tokenizer):
    specials = list(CHAT_TOKENS) + list(get_schema("npr").tags)
    vocab = tokenizer.get_vocab()
    for special in specials:
        assert len(tokenizer.encode(special, add_special_tokens=False)) == 1, special
    # Without splitting the corpus on specials, BPE learns pieces of them ("guid", "<|") as merges.
    learned = [t for t in vocab if t not in specials]
    assert not [t for t in learned if "guid" in t or "im_" in t or "<|" in t]


def test_render_chat_equals_the_tokenizers_chat_template(tokenizer):
    messages = [{"role": "user", "content": "Compute (1 + 2) + (3 - 4)."}]
    for add_generation_prompt in (False, True):
        expected = tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt
        )
        assert render_chat(messages, add_generation_prompt) == expected


def test_a_corpus_of_only_specials_is_a_clear_error():
    with pytest.raises(ValueError, match="non-empty corpus"):
        train_tokenizer(["<|im_start|><|im_end|>", ""], 512, "npr")
