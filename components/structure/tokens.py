"""Token ids of a schema's tags, looked up once from a tokenizer (tags must be single tokens)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from components.structure.errors import TagTokenError
from components.structure.schemas import Role, Schema, get_schema


@dataclass(frozen=True)
class TagIds:
    """``{tag: token_id}`` for every tag of ``schema``, plus an optional ``decode(ids) -> str``.

    The decoder lets ``parse_ids`` check content (labels, lengths, the boxed answer); mask and position
    building never needs it.
    """

    schema: Schema
    ids: Mapping[str, int]
    decode: Callable[[Sequence[int]], str] | None = field(default=None, compare=False, repr=False)
    role_of_id: dict[int, Role] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        missing = [t for t in self.schema.tags if t not in self.ids]
        if missing:
            raise ValueError(f"TagIds for schema {self.schema.name} lacks ids for {missing}")
        extra = [t for t in self.ids if t not in self.schema.role_of]
        if extra:
            raise ValueError(f"TagIds for schema {self.schema.name} has unknown tags {extra}")
        values = [int(v) for v in self.ids.values()]
        if len(set(values)) != len(values):
            raise ValueError(
                f"TagIds for schema {self.schema.name}: two tags share a token id: {dict(self.ids)}"
            )
        if min(values) < 0:
            raise ValueError(f"TagIds for schema {self.schema.name}: negative token id in {dict(self.ids)}")
        role_of_id = {int(i): self.schema.role_of[t] for t, i in self.ids.items()}
        object.__setattr__(self, "ids", {t: int(i) for t, i in self.ids.items()})
        object.__setattr__(self, "role_of_id", role_of_id)

    def __hash__(self) -> int:  # usable as a cache key; the decoder does not take part
        return hash((self.schema.name, tuple(sorted(self.ids.items()))))

    def id_for(self, role: Role) -> int:
        """The token id of the tag playing ``role``."""
        return self.ids[self.schema.tag(role)]

    @classmethod
    def from_tokenizer(cls, tokenizer: Any, schema: str | Schema) -> TagIds:
        """Look every tag up in a Hugging Face tokenizer; ``TagTokenError`` if one is not a single token."""
        schema = get_schema(schema)
        ids: dict[str, int] = {}
        for tag in schema.tags:
            pieces = list(tokenizer.encode(tag, add_special_tokens=False))
            if len(pieces) != 1:
                raise TagTokenError(tag, pieces)
            ids[tag] = int(pieces[0])

        def decode(token_ids: Sequence[int]) -> str:
            return tokenizer.decode(list(token_ids), skip_special_tokens=False)

        return cls(schema=schema, ids=ids, decode=decode)
