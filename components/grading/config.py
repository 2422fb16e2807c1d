"""Config of answer grading and rewards (owned by components/grading)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from components.settings import StrictModel

Fallback = Literal["answer_line", "last_number"]
Purpose = Literal["reward", "evaluation", "distill", "cli"]
PURPOSES: tuple[str, ...] = ("reward", "evaluation", "distill", "cli")
# What the ``answer_line`` fallback reads as an answer label, matched case-insensitively: an entry ending
# with a colon is a label (``Réponse : 12``, ``答案：12``), any other a phrase the answer follows
# (``la réponse est 12``, ``答案是12``). English sentences ("the answer is ...") are read whatever it says.
DEFAULT_ANSWER_LABELS: tuple[str, ...] = (
    "final answer:",
    "answer:",
    "réponse finale :",
    "réponse :",
    "réponse est",
    "endgültige antwort:",
    "antwort:",
    "antwort ist",
    "respuesta final:",
    "respuesta:",
    "respuesta es",
    "resposta final:",
    "resposta:",
    "resposta é",
    "risposta finale:",
    "risposta:",
    "risposta è",
    "окончательный ответ:",
    "ответ:",
    "最终答案：",
    "最終答案：",
    "答案：",
    "答案是",
    "答案为",
    "答え：",
    "정답:",
)


class ExtractionConfig(StrictModel):
    """How the final answer is read from a response for one purpose (see ``answers.extract_final``).

    A complete ``\\boxed{}`` (or ``\\fbox``/``\\framebox``; consecutive boxes joined into one answer) and
    the sentence "The final answer is X" (Minerva's, "I hope it is correct." optional) are always read, the
    later of the two winning, as math-verify ranks them. ``fallbacks`` are tried in order only when neither is present:
    ``answer_line`` (the last ``Final Answer:`` / ``Answer:`` label or "the answer is ..."),
    ``last_number`` (the last number anywhere: a guess, never an explicit answer; opt in per profile).
    ``require_complete``: a truncated response (finish reason other than ``stop``, or a box opened after the
    last complete one) has no answer at all, so it can never earn credit.
    ``labels``: the answer labels ``answer_line`` reads (``DEFAULT_ANSWER_LABELS`` says how); inside ``GradingConfig`` it is filled
    from the one table ``grading.extraction.labels`` (so it is not written out per purpose).
    """

    fallbacks: list[Fallback] = []
    require_complete: bool = True
    labels: list[str] = Field(default_factory=lambda: list(DEFAULT_ANSWER_LABELS), exclude=True)

    @model_validator(mode="after")
    def _labels_not_blank(self) -> ExtractionConfig:
        if any(not label.strip() for label in self.labels):
            raise ValueError("grading.extraction labels must be non-blank strings")
        return self


class ExtractionByPurpose(StrictModel):
    """``grading.extraction``: one ``ExtractionConfig`` per use of the grader.

    ``labels``: the answer-label table every purpose reads (see ``ExtractionConfig.labels``).
    ``reward``: RL rewards (npr_zero, papo_rl, sr_rl, verl's reward function); ``evaluation``: the evaluate
    stage, ``npr eval``, the nightly gate and the held-out evaluations inside training stages; ``distill``:
    the correctness of distilled trajectories (what reject_filter keeps); ``cli``: ``npr grade``.
    """

    reward: ExtractionConfig = ExtractionConfig()
    evaluation: ExtractionConfig = ExtractionConfig(fallbacks=["answer_line"])
    distill: ExtractionConfig = ExtractionConfig()
    cli: ExtractionConfig = ExtractionConfig(fallbacks=["answer_line"])
    labels: list[str] = Field(default_factory=lambda: list(DEFAULT_ANSWER_LABELS))

    @model_validator(mode="after")
    def _share_labels(self) -> ExtractionByPurpose:
        # One table for every purpose: the languages a model answers in do not depend on the use.
        for purpose in PURPOSES:
            settings = getattr(self, purpose)
            if "labels" in settings.model_fields_set and settings.labels != self.labels:
                raise ValueError(
                    f"grading.extraction.{purpose}.labels is not a setting; the label table is "
                    "grading.extraction.labels (one for every purpose)"
                )
            object.__setattr__(self, purpose, settings.model_copy(update={"labels": list(self.labels)}))
        return self

    def for_purpose(self, purpose: str) -> ExtractionConfig:
        """The settings of ``purpose``; ValueError naming the known purposes otherwise."""
        if purpose not in PURPOSES:
            raise ValueError(f"unknown grading purpose {purpose!r}; known: {', '.join(PURPOSES)}")
        return getattr(self, purpose)


class Stage1Reward(StrictModel):
    """NPR-Zero: format pass -> +correct / wrong; format fail -> the format penalty; empty -> minimum."""

    correct: float = 1.0
    wrong: float = -1.0
    empty: float = -2.0
    # Reward of a format failure = max(empty, invalid_offset + format score). 0 is the paper's rule (the
    # penalty itself). With a seed that is right far less than half the time, a nearly valid trace (-0.4)
    # then out-earns a valid wrong one (-1) and RL drifts to "almost valid" (measured on the tiny profile:
    # format-valid 12.5% -> 9.5% in 10 steps; with offset -0.7 it reached 79% and then collapsed to 0% on
    # traces with a -0.2 penalty). An offset of `wrong` keeps every failure below every pass.
    invalid_offset: float = Field(0.0, le=0.0)


class Stage3Reward(StrictModel):
    """PAPO: accuracy only; invalid structure is filtered, not scored.

    ``filter_on``: ``structural`` filters a response whose tag sequence the grammar rejects (no attention
    mask can be built from it; NPR's trainer drops exactly these), ``any_violation`` filters every response
    with a format score below 0.
    """

    correct: float = 1.0
    wrong: float = -1.0
    empty: float = 0.0
    filter_on: Literal["structural", "any_violation"] = "structural"


class AccuracyReward(StrictModel):
    """Parallel-R1's ``accuracy``: +correct / wrong by the answer alone (empty or truncated = wrong)."""

    correct: float = 1.0
    wrong: float = -1.0


class AlternatingParallelReward(StrictModel):
    """Parallel-R1's ``accuracy_parallel_interv`` (npr-reference.md §3.5): accuracy on most steps, and on the
    last ``parallel_steps`` of every ``period`` training steps a correct, well-formed parallel answer earns
    ``correct_parallel``, a correct sequential one (no tag of the schema at all) ``correct``, anything else
    ``wrong``. Steps count from 1 (verl's ``global_steps``): with the paper's 10 / 2, steps 1-8 are accuracy
    only and 9-10 reward parallel thinking.
    """

    correct: float = 1.0
    wrong: float = -1.0
    correct_parallel: float = 1.2
    period: int = Field(10, ge=1)
    parallel_steps: int = Field(2, ge=0)

    @model_validator(mode="after")
    def _steps_within_period(self) -> AlternatingParallelReward:
        if self.parallel_steps > self.period:
            raise ValueError(f"parallel_steps={self.parallel_steps} exceeds period={self.period}")
        return self

    def rewards_parallel(self, step: int) -> bool:
        """Whether 1-based training step ``step`` is one of the steps that reward parallel answers."""
        if step < 1:
            raise ValueError(f"training steps count from 1, got {step}")
        return (step - 1) % self.period >= self.period - self.parallel_steps


# The sections of GradingConfig that hold a reward's values, by reward name (components.grading.rewards).
REWARD_SECTIONS: tuple[str, ...] = ("stage1", "stage3", "accuracy", "accuracy_parallel_interv")


class GradingConfig(StrictModel):
    """Answer extraction per purpose, equivalence (fast path, then math-verify in a process pool), rewards.

    ``timeout_s`` bounds math-verify on one (gold, pred) pair; ``workers`` is the pool size; pairs go to the
    pool in chunks of ``chunk_size``; ``pool_start_timeout_s`` is the grace for spawning a worker (a fresh
    interpreter importing sympy); ``float_rel_tol`` is the tolerance of the numeric fast path for
    non-integers (two integers compare exactly).
    """

    extraction: ExtractionByPurpose = ExtractionByPurpose()
    timeout_s: float = Field(5.0, gt=0)
    workers: int = Field(2, ge=1)
    chunk_size: int = Field(32, ge=1)
    pool_start_timeout_s: float = Field(60.0, gt=0)
    float_rel_tol: float = Field(1e-6, ge=0)
    stage1: Stage1Reward = Stage1Reward()
    stage3: Stage3Reward = Stage3Reward()
    accuracy: AccuracyReward = AccuracyReward()
    accuracy_parallel_interv: AlternatingParallelReward = AlternatingParallelReward()

    @model_validator(mode="before")
    @classmethod
    def _moved_keys(cls, data: Any) -> Any:
        # `grading.fallbacks` (one list for every use) became `grading.extraction.<purpose>.fallbacks`; say so
        # instead of the generic "extra inputs are not permitted".
        if isinstance(data, dict) and "fallbacks" in data:
            raise ValueError(
                "grading.fallbacks was replaced by grading.extraction.<purpose>.fallbacks "
                f"(purposes: {', '.join(PURPOSES)}); last_number is opt-in per purpose"
            )
        return data
