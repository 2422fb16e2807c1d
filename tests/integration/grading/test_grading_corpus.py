"""The grading corpus (tests/data/grading): our grader agrees with the public graders' verdicts.

Cases come from Math-Verify's, hendrycks/math's, OlympiadBench's and Qwen2.5-Math's test suites and the
shipped benchmark files (reference solutions and constructed responses on real answers); the held-out file
(AReaL's, Trinity-RFT's and slime's reward tests, tiny-run model outputs on the shipped benchmark samples)
was not looked at while the grader was tuned: graded blind it agreed on 82/86 counted cases, and the two
classes it missed (gold texts with an answer label, a computation on a matrix environment) were then fixed
(tests/data/grading/README.md). The blind split (issue 28: NeMo-Skills', TRL's, open-r1's, lighteval's and
lambda-feedback's tests) was graded once before the grader was tuned on it: 81/85 counted cases, then
84/85 (docs/results.md). The second blind split (issue 44: KAS's, Doenet math-expressions', STACK's,
MARIO_EVAL's, verl's and eval-protocol's tests) was graded once before any change of issue 44: 499/655
counted cases with 10 false credits; its classes are each held to the bar here. Agreement is counted on the
cases whose verdict is not one library's option.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest

from components.grading.config import GradingConfig
from components.grading.corpus import SPLITS, agreement, load_cases, our_verdicts

MIN_AGREEMENT = 0.97


def test_corpus_is_large_sourced_and_split() -> None:
    tune, heldout = load_cases("tune"), load_cases("heldout")
    assert len(tune) + len(heldout) >= 400 and len(heldout) >= 50
    ids = [c.id for c in tune + heldout]
    assert len(ids) == len(set(ids))
    assert not {(json.dumps(c.gold), c.pred) for c in tune} & {(json.dumps(c.gold), c.pred) for c in heldout}
    for case in tune + heldout:
        source = case.source
        assert ({"repo", "path", "commit", "case"} <= set(source)) or (
            {"benchmark", "file", "id"} <= set(source)
        )
        assert case.option is None or case.note, f"{case.id}: a flagged case says why"
    kinds = Counter(c.kind for c in tune)
    assert kinds["answer"] >= 150 and kinds["response"] >= 150
    # every class the issue names is represented
    classes = Counter(cls for c in tune for cls in c.classes)
    for needed in (
        "percent",
        "decimal_comma",
        "currency",
        "thousands",
        "multi_box",
        "chain",
        "labelled",
        "gold_text",
        "answer_line",
        "stray",
        "units",
        "order",
        "truncated",
        "unanswered",
        "garbage",
    ):
        assert classes[needed] > 0, needed
    with pytest.raises(ValueError, match="unknown corpus split"):
        load_cases("train")
    assert set(SPLITS) == {"tune", "heldout", "blind", "blind2"}


# The classes issue 28 named: relations, R1-style answer tags, thinking blocks, symbolic equivalence (plain /
# CAS notation and identities), answer labels in other languages.
ISSUE_28_CLASSES = ("equation", "answer_tag", "thinking", "symbolic", "multilingual")


def test_blind_split_is_fresh_and_covers_the_new_classes() -> None:
    tune, heldout, blind = load_cases("tune"), load_cases("heldout"), load_cases("blind")
    assert len(blind) >= 80
    earlier = {(json.dumps(c.gold), c.pred) for c in tune + heldout}
    assert not {(json.dumps(c.gold), c.pred) for c in blind} & earlier
    assert not {c.id for c in blind} & {c.id for c in tune + heldout}
    # its sources are test suites the other splits do not use
    earlier_repos = {c.source.get("repo") for c in tune + heldout} - {None}
    assert not {c.source["repo"] for c in blind} & earlier_repos
    for split, cases in (("tune", tune), ("blind", blind)):
        classes = Counter(cls for c in cases if c.option is None for cls in c.classes)
        for needed in ISSUE_28_CLASSES:
            assert classes[needed] >= 3, (split, needed)


# The classes issue 44 named: statements without variables, relations (both sides, decimals and identities
# inside them, CAS notation), functions (reciprocal, hyperbolic, inverse, factorial, powers, degrees),
# expressions whose variables cancel, units on the gold, solution sets with several variables, and the two
# answer conventions it decided (no box and no label; several boxes).
ISSUE_44_CLASSES = (
    "variable_free_relation",
    "relation",
    "function",
    "simplification",
    "units",
    "several_variables",
    "no_box_no_label",
    "multi_box",
)


def test_second_blind_split_is_fresh_and_covers_the_classes_of_issue_44() -> None:
    earlier = [c for split in ("tune", "heldout", "blind") for c in load_cases(split)]
    blind2 = load_cases("blind2")
    assert len(blind2) >= 500
    earlier_pairs = {(json.dumps(c.gold), c.pred) for c in earlier}
    assert not {(json.dumps(c.gold), c.pred) for c in blind2} & earlier_pairs
    assert not {c.id for c in blind2} & {c.id for c in earlier}
    assert len({c.id for c in blind2}) == len(blind2)
    earlier_repos = {c.source.get("repo") for c in earlier} - {None}
    assert not {c.source["repo"] for c in blind2} & earlier_repos
    for case in blind2:
        assert {"repo", "path", "commit", "case"} <= set(case.source)
        assert case.option is None or case.note, f"{case.id}: a flagged case says why"
    classes = Counter(cls for c in blind2 if c.option is None for cls in c.classes)
    for needed in ISSUE_44_CLASSES:
        assert classes[needed] >= 1, needed


@pytest.fixture(scope="module")
def corpus_cfg(pool_cfg: GradingConfig) -> GradingConfig:
    # A generous per-pair deadline: a few physics answers take seconds of sympy on a loaded 2-core box,
    # and a timeout is an infrastructure verdict, not the grader's.
    return pool_cfg.model_copy(update={"timeout_s": 30.0})


# Flagged cases whose source's verdict is False only under that library's convention, which the grader does
# not share on purpose: MATH's ordered string comparison of a bare list (ours reads an "all solutions" list
# as a set), Trinity-RFT's boxed-only reading (the evaluation purpose also reads answer lines; the reward
# purpose does not), KAS's and STACK's comparison of the written form and of the answer's type (an equation
# is not its value; ours reads a bare value as the value of an assignment), STACK's exact floats and the
# two float quirks its fixture documents (ours compares decimals within float_rel_tol; 4.52*10^2 is 452),
# MARIO_EVAL's reading of `10cm` as `10*c*m` (ours strips a unit word after a number) and eval-protocol's
# require_units setting (ours strips the gold's unit). Every other case the corpus calls wrong must be
# graded wrong.
CONVENTIONS_THAT_CREDIT = frozenset(
    {
        "hendrycks.ordered_lists",
        "trinity.boxed_only",
        "kas.form",
        "kas.type_strict",
        "stack.float_precision",
        "stack.quirk",
        "mario.short_unit",
        "eval_protocol.require_units",
    }
)


@pytest.mark.parametrize("split", ["tune", "heldout", "blind", "blind2"])
def test_grader_agrees_with_the_corpus(split: str, corpus_cfg: GradingConfig) -> None:
    cases = load_cases(split)
    verdicts = our_verdicts(cases, corpus_cfg)
    report = agreement(cases, verdicts)
    print(split, json.dumps({k: v for k, v in report.items() if k != "misses"}))
    misses = [c for c in cases if c.id in set(report["misses"])]
    assert report["counted"]["rate"] >= MIN_AGREEMENT, [(c.id, c.gold, c.pred[-200:]) for c in misses]
    false_credit = [
        (c.id, c.gold, c.pred[-120:])
        for c, verdict in zip(cases, verdicts, strict=True)
        if verdict and not c.expected and c.option not in CONVENTIONS_THAT_CREDIT
    ]
    assert not false_credit, false_credit
    # every class of issues 28 and 44 at the bar on its own
    for cls in ISSUE_28_CLASSES + ISSUE_44_CLASSES:
        subset = [
            (c, v) for c, v in zip(cases, verdicts, strict=True) if c.option is None and cls in c.classes
        ]
        if subset:
            rate = sum(c.expected == v for c, v in subset) / len(subset)
            assert rate >= MIN_AGREEMENT, (
                cls,
                [(c.id, c.gold, c.pred[-120:]) for c, v in subset if c.expected != v],
            )
