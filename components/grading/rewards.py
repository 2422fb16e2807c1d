"""Rewards as small registered functions of a ``Judgement``; values from ``GradingConfig.stage1/stage3``.

- ``stage1`` (NPR-Zero, DAPO): empty response -> ``stage1.empty`` (the minimum); a response with any
  format violation -> its format score (in [-2, 0)); a well-formed one -> ``stage1.correct`` /
  ``stage1.wrong``. The paper's Stage-1 reward; the public code has this format term commented out
  (npr-reference §1.5), we keep it on because teaching the format is what Stage 1 is for.
- ``stage3`` (PAPO): empty -> ``stage3.empty``; a response the structural filter rejects (see
  ``Stage3Reward.filter_on``) -> ``filtered=True`` and a neutral score of 0.0 that is never a learning
  signal (the trainer drops it); otherwise ``stage3.correct`` / ``stage3.wrong`` by accuracy only.

- ``accuracy`` (Parallel-R1): ``accuracy.correct`` / ``accuracy.wrong`` by the answer alone.
- ``accuracy_parallel_interv`` (Parallel-R1's Stage-2 reward, a *scheduled* reward: it reads the 1-based
  training step): accuracy only on most steps; on the steps ``AlternatingParallelReward.rewards_parallel``
  names, a correct answer in a well-formed parallel trace (no format violation, so at least one complete
  block) earns ``correct_parallel``, a correct one with no tag of the schema at all ``correct``, anything
  else ``wrong``. "Well-formed" is our structure module's verdict (``Judgement.valid``), stricter than the
  public code's tag-stack check: it also holds paths and summaries to the schema's minimum lengths.

``score_many(name, responses, golds, schema, cfg, finish_reasons=..., step=...)`` judges a batch once (with
the ``reward`` extraction settings: an explicit final answer only, nothing for a truncated response) and
applies the reward; a scheduled reward needs ``step``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from components.grading.config import GradingConfig
from components.grading.judge import Judgement, judge_many
from components.structure.schemas import Schema


@dataclass(frozen=True)
class RewardResult:
    """A scored response: ``score`` (the reward), ``filtered`` (drop it from training instead of scoring)."""

    score: float
    correct: bool
    valid: bool
    format_score: float
    filtered: bool
    pred: str | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


RewardFn = Callable[..., RewardResult]
REWARDS: dict[str, RewardFn] = {}
# Rewards that depend on the training step: called as ``fn(judgement, cfg, step=s)`` (s counts from 1).
SCHEDULED: set[str] = set()


def register_reward(name: str, *, scheduled: bool = False) -> Callable[[RewardFn], RewardFn]:
    """Register a reward under ``name``; registering a different function under a taken name raises.

    A reward is ``fn(judgement, cfg) -> RewardResult``; a ``scheduled`` one also takes ``step=`` (the
    1-based training step) and must be called with it (``apply_reward``).
    """

    def decorator(fn: RewardFn) -> RewardFn:
        existing = REWARDS.get(name)
        if existing is not None and existing is not fn:
            raise ValueError(
                f"reward {name!r} is already registered ({existing.__module__}.{existing.__qualname__})"
            )
        REWARDS[name] = fn
        if scheduled:
            SCHEDULED.add(name)
        return fn

    return decorator


def is_scheduled(name: str) -> bool:
    """Whether reward ``name`` reads the training step (KeyError for an unknown reward)."""
    get_reward(name)
    return name in SCHEDULED


def apply_reward(name: str, judgement: Judgement, cfg: GradingConfig, step: int | None = None) -> RewardResult:
    """Reward ``name`` of one judgement; ``step`` (1-based) is required by scheduled rewards only."""
    reward = get_reward(name)
    if name not in SCHEDULED:
        return reward(judgement, cfg)
    if step is None:
        raise ValueError(f"reward {name!r} depends on the training step; pass step= (counting from 1)")
    return reward(judgement, cfg, step=int(step))


def get_reward(name: str) -> RewardFn:
    """The reward registered as ``name``; KeyError listing the known names otherwise."""
    try:
        return REWARDS[name]
    except KeyError:
        raise KeyError(f"unknown reward {name!r}; registered: {', '.join(sorted(REWARDS))}") from None


def _result(j: Judgement, score: float, filtered: bool = False) -> RewardResult:
    return RewardResult(
        score=float(score),
        correct=j.correct,
        valid=j.valid,
        format_score=j.format_score,
        filtered=filtered,
        pred=j.pred,
    )


@register_reward("stage1")
def stage1_reward(j: Judgement, cfg: GradingConfig) -> RewardResult:
    """Format first, then accuracy: empty -> min; violations -> format score; else +correct / wrong."""
    values = cfg.stage1
    if j.empty:
        return _result(j, values.empty)
    if not j.valid:
        # The paper's rule is the penalty itself (invalid_offset 0); see Stage1Reward.invalid_offset.
        # Kept at or above the empty-response minimum.
        return _result(j, max(values.empty, values.invalid_offset + j.format_score))
    return _result(j, values.correct if j.correct else values.wrong)


@register_reward("stage3")
def stage3_reward(j: Judgement, cfg: GradingConfig) -> RewardResult:
    """Accuracy only; the structurally filtered are flagged, not scored."""
    values = cfg.stage3
    if j.empty:
        return _result(j, values.empty)
    rejected = j.malformed if values.filter_on == "structural" else not j.valid
    if rejected:
        return _result(j, 0.0, filtered=True)
    return _result(j, values.correct if j.correct else values.wrong)


@register_reward("accuracy")
def accuracy_reward(j: Judgement, cfg: GradingConfig) -> RewardResult:
    """Parallel-R1's accuracy reward: the answer alone decides."""
    values = cfg.accuracy
    return _result(j, values.correct if j.correct else values.wrong)


# Violations of a response that holds no tag of the schema: the missing block (and its answer check).
_SEQUENTIAL_CODES = frozenset({"no_block", "missing_answer"})


@register_reward("accuracy_parallel_interv", scheduled=True)
def alternating_parallel_reward(j: Judgement, cfg: GradingConfig, *, step: int) -> RewardResult:
    """Parallel-R1's alternating reward (module docstring); ``step`` counts training steps from 1."""
    values = cfg.accuracy_parallel_interv
    if not values.rewards_parallel(step):
        return _result(j, values.correct if j.correct else values.wrong)
    if j.correct and j.valid:
        return _result(j, values.correct_parallel)
    if j.correct and set(j.violations) <= _SEQUENTIAL_CODES:
        return _result(j, values.correct)
    return _result(j, values.wrong)


def score_many(
    name: str,
    responses: Sequence[str],
    golds: Sequence[Any],
    schema: str | Schema = "npr",
    cfg: GradingConfig | None = None,
    *,
    finish_reasons: Sequence[str | None] | None = None,
    step: int | None = None,
) -> list[RewardResult]:
    """Judge a batch (answers graded together) and apply the reward ``name`` to each response.

    ``finish_reasons`` (the engine's, one per response) marks responses cut off by the token budget: they
    have no answer, so they can be rewarded for their format at most, never for a correct answer.
    ``step``: the 1-based training step, for scheduled rewards (``accuracy_parallel_interv``).
    """
    if is_scheduled(name) and step is None:
        raise ValueError(f"reward {name!r} depends on the training step; pass step= (counting from 1)")
    cfg = cfg or GradingConfig()
    judgements = judge_many(responses, golds, schema, cfg, purpose="reward", finish_reasons=finish_reasons)
    return [apply_reward(name, j, cfg, step) for j in judgements]


def score_response(
    name: str,
    response: str,
    gold: Any,
    schema: str | Schema = "npr",
    cfg: GradingConfig | None = None,
    *,
    finish_reason: str | None = None,
    step: int | None = None,
) -> RewardResult:
    """``score_many`` for one response."""
    return score_many(name, [response], [gold], schema, cfg, finish_reasons=[finish_reason], step=step)[0]
