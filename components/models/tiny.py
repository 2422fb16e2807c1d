"""The tiny world: a byte-level BPE tokenizer trained on the pipeline's own synthetic text, and a tiny Qwen3.

The ``tiny`` profile replaces the 4B instruct model with a ~1.7M-parameter ``Qwen3ForCausalLM`` whose
tokenizer is trained here, offline, in a few seconds. Both are ordinary Hugging Face objects, so every
later stage (engine, RL, SFT, evaluation) runs the same code it runs on the real model.

Tokenizer design (../shared/notes/tiny-feasibility.md, stack-ml.md §1):
- every digit is its own pre-token (with the space before it, if any: `` 7`` is one token, ``40`` two), so
  arithmetic is learnable digit by digit without a separate token for the space in front of each number;
- the corpus is whole chat-rendered turns (role headers included), so ``user`` and ``assistant`` are one
  token each (3 and 7 before); with the digit rule, a seed sample went from 107 to 89 tokens;
- ``<pad>``, ``<|im_start|>``, ``<|im_end|>`` and the schema's tags are the trainer's special tokens, so they
  get fixed low ids, are never merged, and always encode to exactly one id;
- a Qwen-style chat template (``<|im_start|>role\\n...<|im_end|>\\n``) with ``add_generation_prompt``; the end
  of an assistant turn is ``<|im_end|>``, which is also the EOS token.
"""

from __future__ import annotations

import functools
import random
import re
from collections.abc import Iterable
from typing import Any

import jinja2
import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

from components.data import synthetic
from components.models.config import TinyArchitecture
from components.structure import get_schema

PAD_TOKEN = "<pad>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
CHAT_TOKENS = (PAD_TOKEN, IM_START, IM_END)

# Qwen's chat layout without Qwen's tool/thinking branches (the tiny model has neither). `enable_thinking`
# and other template kwargs are accepted and ignored, as Qwen3-Instruct-2507's template does.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
)

# Architecture of the model returned by `tiny_test_world`: small enough that other engineers' unit tests
# build, run and backpropagate it in milliseconds; it only needs to be a real Qwen3, not a good one.
TEST_WORLD_ARCH = TinyArchitecture(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=512,
    tokenizer_vocab_size=384,
    tokenizer_corpus_size=400,
)


def schema_tags(schema_name: str) -> list[str]:
    """The tag strings of a structure schema, in the schema's order."""
    return list(get_schema(schema_name).tags)


def train_tokenizer(corpus: Iterable[str], vocab_size: int, schema_name: str) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer (one digit per token) with chat tokens and the schema's tags as specials.

    ``vocab_size`` is an upper bound: a very regular corpus saturates below it (the tiny corpus stops at
    about 390 entries). Raises ValueError on an empty corpus.
    """
    specials = list(CHAT_TOKENS) + [t for t in schema_tags(schema_name) if t not in CHAT_TOKENS]
    # The BPE trainer does not treat specials in its input as atomic: split them out so no merge spans one.
    special_split = re.compile("|".join(re.escape(t) for t in specials))
    texts = [piece for text in corpus for piece in special_split.split(text) if piece]
    if not texts:
        raise ValueError("train_tokenizer needs a non-empty corpus")
    if vocab_size < 256 + len(specials):
        raise ValueError(
            f"vocab_size {vocab_size} is smaller than the byte alphabet plus {len(specials)} specials"
        )

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(r" ?[0-9]"), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(texts, trainer=trainer)

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=IM_END,
        pad_token=PAD_TOKEN,
        additional_special_tokens=specials[1:],
        # Batched generation pads decoder-only prompts on the left; SFT builds its own padded batches.
        padding_side="left",
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_tiny_model(
    arch: TinyArchitecture,
    tokenizer: Any,
    seed: int,
    attn_implementation: str = "sdpa",
    pad_vocab_to_multiple_of: int = 1,
) -> Qwen3ForCausalLM:
    """A randomly initialised Qwen3ForCausalLM for ``tokenizer``, deterministic given ``seed``.

    The global torch RNG is left untouched (initialisation runs on a forked RNG state). The embedding has
    ``len(tokenizer)`` rows rounded up to ``pad_vocab_to_multiple_of``; input and output embeddings are tied.
    """
    if arch.num_attention_heads % arch.num_key_value_heads:
        raise ValueError(
            f"num_attention_heads ({arch.num_attention_heads}) must be a multiple of "
            f"num_key_value_heads ({arch.num_key_value_heads})"
        )
    multiple = max(1, pad_vocab_to_multiple_of)
    vocab_size = -(-len(tokenizer) // multiple) * multiple
    config = Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=arch.hidden_size,
        intermediate_size=arch.intermediate_size,
        num_hidden_layers=arch.num_hidden_layers,
        num_attention_heads=arch.num_attention_heads,
        num_key_value_heads=arch.num_key_value_heads,
        head_dim=arch.head_dim,
        max_position_embeddings=arch.max_position_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": arch.rope_theta},
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    config._attn_implementation = attn_implementation
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.bos_token_id = None
    return model


@functools.cache
def _compiled_chat_template() -> jinja2.Template:
    return jinja2.Environment(autoescape=False).from_string(CHAT_TEMPLATE)


def render_chat(messages: list[dict[str, str]], add_generation_prompt: bool = False) -> str:
    """``CHAT_TEMPLATE`` rendered without a tokenizer (the tokenizer's corpus is built before the tokenizer).

    Same text as ``tokenizer.apply_chat_template(messages, tokenize=False, ...)`` of a trained tokenizer.
    """
    return _compiled_chat_template().render(messages=messages, add_generation_prompt=add_generation_prompt)


def synthetic_corpus(n: int, seed: int, parallel_fraction: float = 0.5) -> list[str]:
    """Problem texts and rendered solutions of the synthetic task family (for tokenizer training).

    Uses ``components.data.synthetic`` (the data engineer's generator and renderer), so the tokenizer's
    merges follow exactly the text the tiny model will be trained and evaluated on.
    """
    rng = random.Random(seed)
    texts: list[str] = []
    for record in synthetic.generate_problems(n, seed, None):
        style = "parallel" if rng.random() < parallel_fraction else "sequential"
        texts.append(record["problem"])
        texts.append(synthetic.render_solution(record, style, rng, None))
    return texts


def tiny_test_world(
    seed: int = 0, schema_name: str = "npr"
) -> tuple[Qwen3ForCausalLM, PreTrainedTokenizerFast]:
    """A small random-init Qwen3 and a tokenizer trained on a small synthetic corpus (about a second).

    For other components' fast tests: real tokenizer (tags are single tokens, chat template works), real
    model (sdpa, tied embeddings, ~0.1M parameters), untrained. Returned fresh on every call.
    """
    arch = TEST_WORLD_ARCH
    tokenizer = train_tokenizer(
        synthetic_corpus(arch.tokenizer_corpus_size, seed), arch.tokenizer_vocab_size, schema_name
    )
    model = build_tiny_model(arch, tokenizer, seed)
    model.eval()
    return model, tokenizer
