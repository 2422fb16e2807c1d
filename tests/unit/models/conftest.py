"""Fixtures of the models tests: the tiny test world and a Qwen-style tokenizer directory built offline."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

# Qwen2/Qwen3's pre-tokenizer pattern (splits words, single digits, punctuation, whitespace runs).
QWEN_SPLIT = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|fim_pad|>"]


@pytest.fixture(scope="session")
def world():
    from components.models.tiny import tiny_test_world

    return tiny_test_world(seed=0)


@pytest.fixture(scope="session")
def qwen_style_tokenizer_dir(tmp_path_factory) -> Path:
    """A byte-level BPE laid out like a Qwen3 tokenizer directory (Qwen2Tokenizer class, <|endoftext|> pad,
    <|im_end|> EOS, <|fim_pad|> present) without the tags: what add_tag_tokens meets on the real model."""
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    corpus = [
        "guideline plan step takeaway /guideline /plan /step /takeaway",
        "We plan each step, then write a takeaway that follows the guideline.",
    ] * 50
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=QWEN_SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    backend.train_from_iterator(corpus, trainer=trainer)
    path = tmp_path_factory.mktemp("qwen_tok")
    backend.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "Qwen2Tokenizer",
                "eos_token": "<|im_end|>",
                "pad_token": "<|endoftext|>",
                "unk_token": None,
                "bos_token": None,
                "model_max_length": 32768,
            }
        )
    )
    return path
