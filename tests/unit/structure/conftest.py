"""Shared builders for the structure tests: a token vocabulary where every schema tag is one id."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from components.structure import NPR, Schema, TagIds

TAG_BASE = 1000  # tag ids sit above every "text" id used in these tests


def tag_ids_for(schema: Schema, with_decoder: bool = False) -> TagIds:
    ids = {tag: TAG_BASE + i for i, tag in enumerate(schema.tags)}
    decode = None
    if with_decoder:
        # One text token per character (id = code point), so decoded text is the original text.
        names = {i: t for t, i in ids.items()}

        def decode(token_ids: list[int]) -> str:
            return "".join(names.get(i, chr(i)) for i in token_ids)

    return TagIds(schema=schema, ids=ids, decode=decode)


def char_tokens(text: str, tags: TagIds) -> list[int]:
    """Tokenise text: each tag one id, every other character its code point."""
    from components.structure.scan import TEXT, scan_text

    out: list[int] = []
    name_of = {int(r): t for t, r in tags.schema.role_of.items()}
    for role, a, b in scan_text(text, tags.schema):
        if role == TEXT:
            out.extend(ord(c) for c in text[a:b])
        else:
            out.append(tags.ids[name_of[role]])
    return out


# Session scope: these are pure values, and hypothesis tests may not use function-scoped fixtures.
@pytest.fixture(scope="session")
def npr_tags() -> TagIds:
    return tag_ids_for(NPR)


@pytest.fixture(scope="session")
def make_tags() -> Callable[..., TagIds]:
    return tag_ids_for


@pytest.fixture(scope="session")
def tokenize() -> Callable[[str, TagIds], list[int]]:
    return char_tokens
