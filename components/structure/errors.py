"""Typed errors of the structure module.

``StructureError`` is the one error malformed input may raise (mask/position building, strict parsing);
callers that filter data catch it and record ``code``/``reason``/``position`` as the reason for removal.
"""

from __future__ import annotations


class StructureError(ValueError):
    """A trace whose tag sequence the schema's grammar does not accept.

    ``position`` is a token index (id input) or a character offset (text input); ``code`` is the
    violation code of ``components.structure.score.PENALTIES``.
    """

    def __init__(self, reason: str, position: int, code: str = "malformed") -> None:
        super().__init__(f"{reason} (at {position})")
        self.reason = reason
        self.position = position
        self.code = code


class TagTokenError(ValueError):
    """A schema tag that the tokenizer does not encode as exactly one token (``pieces``: its ids), or, with
    ``message``, a tag that cannot be made one (its name tokenises to nothing or to the unknown token)."""

    def __init__(self, tag: str, pieces: list[int] | None = None, *, message: str | None = None) -> None:
        super().__init__(
            message
            or f"tag {tag!r} encodes to {len(pieces or [])} tokens {pieces}; parallel attention needs single-token "
            "tags (add them with components.models.tags.add_tag_tokens)"
        )
        self.tag = tag
        self.pieces = pieces
