"""Tag tokens: make the structure schema's tags single special tokens with a meaningful initialisation.

Stage 2 (warmup SFT) is where the tags stop being multi-token text (npr-reference.md §1.3): the engine's
fork/merge and the parallel attention mask look tags up by id, so each must be exactly one token. A new
embedding row starts as the mean of the embeddings of the sub-tokens of the tag's *name*, i.e. the tag with
``<`` and ``>`` stripped (``</plan>`` -> ``/plan``), so the model's first forward already places it near
the words it stands for. When the output embedding is not tied to the input one, its row gets the same
treatment with the output matrix.
"""

from __future__ import annotations

from typing import Any

import torch

from components.structure import get_schema
from components.structure.errors import TagTokenError

# Pad token choices, in order: Qwen tokenizers ship an unused `<|fim_pad|>` (NPR's SFT pads with it);
# other tokenizers get a dedicated `<pad>` special token.
PAD_TOKEN_CANDIDATES = ("<|fim_pad|>", "<pad>")


def single_token_id(tokenizer: Any, text: str) -> int | None:
    """The id of ``text`` when it encodes to exactly one token, else None."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    return ids[0] if len(ids) == 1 else None


def tag_name_subtoken_ids(tokenizer: Any, tag: str) -> list[int]:
    """Ids of the sub-tokens of the tag's name (``</plan>`` -> tokens of ``/plan``); raises on UNK/empty."""
    name = tag.replace("<", "").replace(">", "")
    ids = tokenizer.encode(name, add_special_tokens=False)
    if not ids:
        raise TagTokenError(tag, message=f"tag {tag!r} has an empty name")
    unk = tokenizer.unk_token_id
    if unk is not None and unk in ids:
        raise TagTokenError(tag, message=f"the name {name!r} of tag {tag!r} tokenises to the unknown token")
    return ids


def ensure_pad_token(tokenizer: Any) -> bool:
    """Give the tokenizer a pad token when it has none; returns True when it changed the tokenizer."""
    if tokenizer.pad_token is not None:
        return False
    vocab = tokenizer.get_vocab()
    for candidate in PAD_TOKEN_CANDIDATES:
        if candidate in vocab:
            tokenizer.pad_token = candidate
            return True
    tokenizer.add_special_tokens({"pad_token": PAD_TOKEN_CANDIDATES[-1]})
    return True


def add_tag_tokens(
    model: Any, tokenizer: Any, schema_name: str, pad_to_multiple_of: int | None = None
) -> dict[str, int]:
    """Add ``schema_name``'s tags as single special tokens, init their rows, set a pad token.

    Each new input-embedding row i (and output row when untied) becomes ``E[sub_ids(tag_i)].mean(0)``,
    computed from the embedding *before* any row is written. The embedding is resized to ``len(tokenizer)``
    rounded up to ``pad_to_multiple_of`` only when it has too few rows (Qwen checkpoints already carry
    spare rows). Idempotent: tags that already encode to one token are left as they are.

    Returns ``{tag: token_id}`` for every tag of the schema.
    """
    tags = list(get_schema(schema_name).tags)
    missing = [tag for tag in tags if single_token_id(tokenizer, tag) is None]
    subtoken_ids = {tag: tag_name_subtoken_ids(tokenizer, tag) for tag in missing}

    if missing:
        tokenizer.add_special_tokens(
            {"additional_special_tokens": missing}, replace_extra_special_tokens=False
        )
    pad_added = ensure_pad_token(tokenizer)

    tag_ids: dict[str, int] = {}
    for tag in tags:
        token_id = single_token_id(tokenizer, tag)
        if token_id is None:
            raise TagTokenError(
                tag, message=f"tag {tag!r} still does not encode to one token after adding it"
            )
        tag_ids[tag] = token_id

    if missing or pad_added:
        _resize_if_needed(model, len(tokenizer), pad_to_multiple_of)
        _init_rows(model, {tag_ids[tag]: subtoken_ids[tag] for tag in missing})
        model.config.pad_token_id = tokenizer.pad_token_id
        if getattr(model, "generation_config", None) is not None:
            model.generation_config.pad_token_id = tokenizer.pad_token_id
    return tag_ids


def _resize_if_needed(model: Any, n_tokens: int, pad_to_multiple_of: int | None) -> None:
    if model.get_input_embeddings().weight.shape[0] >= n_tokens:
        return
    # mean_resizing=False: rows we care about are set explicitly below; the rest are never produced.
    model.resize_token_embeddings(n_tokens, pad_to_multiple_of=pad_to_multiple_of, mean_resizing=False)


@torch.no_grad()
def _init_rows(model: Any, sources: dict[int, list[int]]) -> None:
    """Set row ``new_id`` to the mean of rows ``sources[new_id]`` (input, and output when untied)."""
    if not sources:
        return
    matrices = [model.get_input_embeddings().weight]
    output = model.get_output_embeddings()
    if output is not None and output.weight.data_ptr() != matrices[0].data_ptr():
        matrices.append(output.weight)
    for weight in matrices:
        # Compute every mean first so that a new row never feeds another new row's mean.
        means = {new_id: weight[ids].float().mean(dim=0) for new_id, ids in sources.items()}
        for new_id, mean in means.items():
            weight[new_id] = mean.to(weight.dtype)
