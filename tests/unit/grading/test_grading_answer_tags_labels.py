"""R1-style ``<answer>`` tags, thinking blocks and the multilingual answer-label table (issue 28)."""

from __future__ import annotations

import pytest

from components.grading.answers import extract_final
from components.grading.config import (
    DEFAULT_ANSWER_LABELS,
    PURPOSES,
    ExtractionByPurpose,
    ExtractionConfig,
    GradingConfig,
)
from components.grading.judge import judge_many

STRICT = ExtractionConfig()  # the reward settings: explicit answers only
LINES = ExtractionConfig(fallbacks=["answer_line"])


@pytest.mark.parametrize(
    ("text", "answer", "method"),
    [
        ("<answer>42</answer>", "42", "answer_tag"),
        ("<think>2x+2+1 ...</think> <answer>2x+3</answer>", "2x+3", "answer_tag"),
        ("<think>I guess \\boxed{B}, no wait</think> Final: \\boxed{C}", "C", "boxed"),
        ("<think>maybe <answer>7</answer>?</think>\n<answer>8</answer>", "8", "answer_tag"),
        ("<answer>\\boxed{\\frac{1}{2}}</answer>", "\\frac{1}{2}", "answer_tag"),
        ("<answer> The answer is $5$. </answer>", "5", "answer_tag"),
        ("<ANSWER>9</ANSWER>", "9", "answer_tag"),
        ("\\boxed{3} then <answer>4</answer>", "4", "answer_tag"),
        ("<answer>4</answer> and later \\boxed{5}", "5", "boxed"),
        # the thinking never supplies the answer (TRL's reasoning_accuracy_reward rule)
        ("<think>so \\boxed{4}</think>", None, None),
        ("<think>so \\boxed{4}</think> That is all.", None, None),
        ("<think>\\boxed{4}", None, None),  # a thinking block that never closes
        ("<think>a</think> \\boxed{5} <think>\\boxed{6}", "5", "boxed"),
        ("Reasoning </think> \\boxed{7}", "7", "boxed"),  # the opening tag was in the prompt
        ("<answer></answer>", None, None),
    ],
)
def test_answer_tags_are_explicit_answers(text: str, answer: str | None, method: str | None) -> None:
    found = extract_final(text, STRICT, "stop")
    assert (found.answer, found.method) == (answer, method)


@pytest.mark.parametrize("text", ["<answer>12", "<answer>1</answer> <answer>2", "<think>x</think><answer>3"])
def test_an_unclosed_answer_tag_is_a_truncation(text: str) -> None:
    found = extract_final(text, STRICT)
    assert found.truncated and found.answer is None
    # without the completeness rule the earlier complete tag (if any) is read
    loose = extract_final(text, ExtractionConfig(require_complete=False))
    assert not loose.truncated


def test_thinking_box_never_wins_over_the_final_one_for_every_purpose() -> None:
    text = "<think>I guess \\boxed{B}, no wait</think> Final: \\boxed{C}"
    judgements = {
        purpose: judge_many([text], ["C"], purpose=purpose)[0]
        for purpose in ("reward", "evaluation", "distill")
    }
    assert all(j.correct and j.pred == "C" for j in judgements.values())
    assert not judge_many([text], ["B"], purpose="reward")[0].correct


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        ("Réponse : 12", "12"),
        ("**Réponse finale :** $12$", "12"),
        ("答案：12", "12"),
        ("所以答案：12。", "12"),
        ("Antwort: 12", "12"),
        ("Endgültige Antwort: $\\frac{3}{4}$", "\\frac{3}{4}"),
        ("Respuesta: 7", "7"),
        ("Ответ: 5", "5"),
        ("Final Answer: 9", "9"),
        ("Gegenantwort: 3", None),  # a label must start a word
        ("Réponse 12", None),  # a label needs its colon
        ("La réponse est 12.", "12"),  # a phrase the answer follows
        ("réponse est (35 + 70 = 105).", "(35 + 70 = 105)"),
        ("答案是12", "12"),
        ("Die Antwort ist $\\frac{1}{2}$.", "\\frac{1}{2}"),
    ],
)
def test_multilingual_answer_labels(text: str, answer: str | None) -> None:
    assert extract_final(text, LINES, "stop").answer == answer
    assert extract_final(text, STRICT, "stop").answer is None  # a label is a fallback, never a reward answer


def test_the_label_table_comes_from_config() -> None:
    only_english = ExtractionConfig(fallbacks=["answer_line"], labels=["answer:"])
    assert extract_final("Antwort: 12", only_english).answer is None
    assert extract_final("Answer: 12", only_english).answer == "12"
    assert extract_final("the answer is 12", only_english).answer == "12"  # sentences are built in
    german = ExtractionConfig(fallbacks=["answer_line"], labels=["Lösung:", "die lösung ist"])
    assert extract_final("Lösung: 4", german).answer == "4"
    assert extract_final("Also, die Lösung ist 4.", german).answer == "4"
    assert extract_final("Lösung 4", german).answer is None


def test_grading_extraction_labels_are_shared_by_every_purpose() -> None:
    shared = ExtractionByPurpose(labels=["Lösung"])
    assert all(shared.for_purpose(p).labels == ["Lösung"] for p in PURPOSES)
    with pytest.raises(ValueError, match="grading.extraction.labels"):
        ExtractionByPurpose(labels=["Lösung"], cli=ExtractionConfig(fallbacks=["answer_line"], labels=["x"]))
    # written out once, not per purpose (params.yaml is a dump of the config)
    dumped = GradingConfig(extraction=shared).model_dump()["extraction"]
    assert dumped["labels"] == ["Lösung"] and "labels" not in dumped["cli"]
    assert GradingConfig.model_validate({"extraction": dumped}).extraction.cli.labels == ["Lösung"]
    assert GradingConfig().extraction.evaluation.labels == list(DEFAULT_ANSWER_LABELS)
    with pytest.raises(ValueError, match="non-blank"):
        ExtractionConfig(labels=[" "])


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        ("Réponse: Janeth aura encore 220 $ à payer d'ici 12 mois.", "220"),  # lighteval's French case
        ("Answer: Janet has $1,220 left after 12 months", "1220"),
        ("Answer: 3 dollars after 4 days", "3"),
        ("Answer: 12 apples and 3 pears", "12 apples and 3 pears"),  # no amount: the sentence stays whole
    ],
)
def test_of_several_numbers_in_an_answer_sentence_the_one_amount_is_the_value(text: str, answer: str) -> None:
    assert extract_final(text, LINES, "stop").answer == answer
