"""A verl reward manager whose responses keep their tags: ``npr`` (``reward.reward_manager.name``).

verl's stock managers (naive, dapo, ...) decode the response with ``skip_special_tokens=True``. From
Stage 2 on our tags are special tokens, so the structure reward would never see them: every non-empty
response looks tag-free, ``stage1`` gives each the same format penalty, and groups of equal rewards are
evicted by dynamic sampling forever. ``TagKeepingRewardManager`` is verl's DAPO manager (overlong buffer,
``reward_extra_info``, async scoring: all verl's) handed a tokenizer whose ``decode`` always keeps special
tokens and drops the trailing end-of-turn token, which makes the text exactly the engine's
``Generation.text``: the response without its stop token, decoded with specials (so a Stage-1 prompt whose
tags are plain text is decoded the same way as before).

The score itself is ``components/grading/verl_reward.py:compute_score`` (``reward.custom_reward_function``),
which reads the stage's reward (stage1 / stage3 / accuracy / accuracy_parallel_interv) and its values from each
row's ``extra_info``. A scheduled reward (Parallel-R1's alternating one) also needs the training step: verl's
agent-loop worker hands the manager each sample's fields, ``global_steps`` among them (the v1 trainer puts
it in every prompt), and the manager copies it into ``extra_info["global_step"]`` before scoring.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from verl.experimental.reward_loop.reward_manager import register
from verl.experimental.reward_loop.reward_manager.dapo import DAPORewardManager

from components.engine.controller import end_of_turn_ids
from components.training.verl.plugin_names import REWARD_MANAGER
from components.training.verl.plugins.rollout_log import log_rollout


class TagKeepingDecoder:
    """Wraps a tokenizer: ``decode`` keeps special tokens and strips trailing end-of-turn ids; every other
    attribute is the tokenizer's own."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self._end_ids = frozenset(end_of_turn_ids(tokenizer))

    def decode(self, token_ids: Sequence[int] | Any, skip_special_tokens: bool = False, **kwargs: Any) -> str:
        """The response text with its tags; ``skip_special_tokens`` is ignored on purpose (module docstring)."""
        ids = [int(i) for i in (token_ids.tolist() if hasattr(token_ids, "tolist") else token_ids)]
        while ids and ids[-1] in self._end_ids:
            ids.pop()
        return self._tokenizer.decode(ids, skip_special_tokens=False, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tokenizer, name)


@register(REWARD_MANAGER)
class TagKeepingRewardManager(DAPORewardManager):
    """verl's DAPO reward manager reading responses with their tags (see the module docstring)."""

    def __init__(self, config: Any, tokenizer: Any, compute_score: Any, **kwargs: Any) -> None:
        super().__init__(config, TagKeepingDecoder(tokenizer), compute_score, **kwargs)

    async def run_single(self, data: Any) -> dict:
        """verl's DAPO scoring of one sample, with the sample's training step in its ``extra_info``."""
        steps = data.non_tensor_batch.get("global_steps")
        if steps is not None:
            infos = data.non_tensor_batch.get("extra_info")
            if infos is None:
                infos = np.array([{}] * len(steps), dtype=object)
            data.non_tensor_batch["extra_info"] = np.array(
                [
                    {**(dict(info) if isinstance(info, Mapping) else {}), "global_step": int(step)}
                    for info, step in zip(infos, steps, strict=True)
                ],
                dtype=object,
            )
        result = await super().run_single(data)
        item = data[-1:][0]
        info = item.non_tensor_batch.get("extra_info") or {}
        width = item.batch["responses"].shape[-1]
        extra = result.get("reward_extra_info", {})
        step = data.non_tensor_batch.get("global_steps")
        log_rollout(
            {
                "step": int(step[-1]) if step is not None else None,
                "held_out": bool(info.get("held_out", False)),
                "valid": bool(extra.get("valid", False)),
                "correct": bool(extra.get("acc", 0.0)),
                "parallel": bool(extra.get("parallel", 0.0)),
                "rejected": None,
                "tokens": int(item.batch["attention_mask"][-width:].sum()),
            }
        )
        return result
