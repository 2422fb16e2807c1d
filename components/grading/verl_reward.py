"""verl's custom reward entry point: ``compute_score(data_source, solution_str, ground_truth, extra_info)``.

verl loads this file by path (``reward.custom_reward_function.path`` = this file, ``.name`` =
``compute_score``) and calls it once per response, from a thread pool (its reward loop uses
``run_in_executor``), which is why math-verify runs in our process pool and never in the calling thread.

Which reward and with which values, in increasing precedence:

1. defaults: ``reward="stage1"``, the values of ``GradingConfig()`` (stage1 +1 / -1 / empty -2; stage3
   +1 / -1 / empty 0, structural filter), ``schema="npr"``;
2. keyword arguments, i.e. verl's ``custom_reward_function.reward_kwargs`` (verl merges them into every
   call): ``reward``, ``reward_values``, ``schema``, ``grading``;
3. the row's ``extra_info`` with the same keys.

Answers are read with the ``reward`` extraction settings (an explicit final answer only). verl's reward
loop passes the decoded text without the end-of-sequence token, so it cannot tell a finished response from
one cut at ``max_response_length``: a rollout producer that knows (an agent loop) passes
``extra_info["finish_reason"]`` (``stop`` / ``length`` ...) or a ``finish_reason`` keyword; without it only an
unclosed box marks a response as truncated.

A scheduled reward (``accuracy_parallel_interv``) reads the 1-based training step from
``extra_info["global_step"]`` (our agent loop and reward manager copy verl's ``global_steps`` there) or a
``global_step`` keyword, and fails without one.

``reward_values`` overrides the chosen reward's section (``{"correct": 1, "wrong": -1, "empty": -2}``;
for stage3 also ``filter_on``); ``grading`` overrides other ``GradingConfig`` fields (``timeout_s``,
``workers``, ``fallbacks`` ...). The returned dict always has the same keys (verl stacks them into
per-sample arrays): ``score``, ``acc``, ``pred`` ("" when none), ``format_score``, ``valid``, ``filtered``,
``empty``, ``grade_failed``, ``truncated``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from components.grading.config import REWARD_SECTIONS, GradingConfig
from components.grading.judge import judge
from components.grading.rewards import apply_reward, get_reward, is_scheduled
from components.structure import parse_text, trace_metrics

DEFAULT_REWARD = "stage1"
DEFAULT_SCHEMA = "npr"
_SETTING_KEYS = ("reward", "reward_values", "schema", "grading")


@lru_cache(maxsize=64)
def _grading_config(reward: str, reward_values_json: str, grading_json: str) -> GradingConfig:
    data: dict[str, Any] = json.loads(grading_json)
    values = json.loads(reward_values_json)
    if values:
        if reward not in REWARD_SECTIONS:
            raise ValueError(f"reward_values given for reward {reward!r}, which reads no values section")
        section = dict(data.get(reward, {}))
        section.update(values)
        data[reward] = section
    return GradingConfig.model_validate(data)


def _plain(value: Any) -> Any:
    """JSON fallback for what a parquet round trip leaves in ``extra_info`` (numpy arrays and scalars)."""
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"cannot read reward setting of type {type(value).__name__}")


def _settings(extra_info: Any, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    settings: dict[str, Any] = {key: kwargs[key] for key in _SETTING_KEYS if kwargs.get(key) is not None}
    if isinstance(extra_info, Mapping):
        settings.update({key: extra_info[key] for key in _SETTING_KEYS if extra_info.get(key) is not None})
    return settings


def _training_step(extra_info: Any, kwargs: Mapping[str, Any], reward: str) -> int | None:
    """The 1-based training step a scheduled reward reads: ``extra_info["global_step"]`` (set by our agent
    loop and reward manager from verl's ``global_steps``) or a ``global_step`` keyword; None otherwise."""
    step = kwargs.get("global_step")
    if isinstance(extra_info, Mapping) and extra_info.get("global_step") is not None:
        step = extra_info["global_step"]
    if step is None:
        if is_scheduled(reward):
            raise ValueError(
                f"reward {reward!r} depends on the training step, and this call carries none "
                "(extra_info['global_step'] or a global_step keyword)"
            )
        return None
    return int(_plain(step)) if hasattr(step, "tolist") else int(step)


def compute_score(
    data_source: str | None,
    solution_str: str,
    ground_truth: Any,
    extra_info: Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> dict[str, Any]:
    """Score one response for verl; see the module docstring for how the reward is chosen.

    ``ground_truth`` may be a str, a number or a list/array of alternatives. Unknown extra keyword
    arguments from verl (e.g. ``reward_router_address``) are accepted and ignored.
    """
    settings = _settings(extra_info, kwargs)
    reward_name = str(settings.get("reward", DEFAULT_REWARD))
    get_reward(reward_name)  # an unknown name fails here, before any grading
    cfg = _grading_config(
        reward_name,
        json.dumps(dict(settings.get("reward_values") or {}), sort_keys=True, default=_plain),
        json.dumps(dict(settings.get("grading") or {}), sort_keys=True, default=_plain),
    )
    finish_reason = kwargs.get("finish_reason")
    if isinstance(extra_info, Mapping) and extra_info.get("finish_reason") is not None:
        finish_reason = extra_info["finish_reason"]
    judgement = judge(
        solution_str,
        ground_truth,
        str(settings.get("schema", DEFAULT_SCHEMA)),
        cfg,
        purpose="reward",
        finish_reason=None if finish_reason is None else str(finish_reason),
    )
    result = apply_reward(reward_name, judgement, cfg, _training_step(extra_info, kwargs, reward_name))
    schema = str(settings.get("schema", DEFAULT_SCHEMA))
    return {
        "score": result.score,
        "acc": float(result.correct),
        # the local trainer's held-out vocabulary, per response (verl averages each key over its validation
        # set: val-aux/<source>/<key>/mean@n): correct AND valid, and a parallel trace
        "correct_and_valid": float(result.correct and result.valid),
        "parallel": float(trace_metrics(parse_text(solution_str, schema)).is_parallel),
        "pred": result.pred or "",
        "format_score": result.format_score,
        "valid": result.valid,
        "filtered": result.filtered,
        "empty": judgement.empty,
        "grade_failed": judgement.grade_reason is not None,
        "truncated": judgement.truncated,
    }
