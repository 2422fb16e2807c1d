"""relations.relation_equal in-process (no pool): the rules of its docstring, one pair each, both ways."""

from __future__ import annotations

import pytest

from components.grading.relations import is_relation, parse_relation, relation_equal


@pytest.mark.parametrize(
    ("gold", "pred", "expected"),
    [
        ("x=y", "y=x", True),
        ("-y=-x", "y=x", True),
        ("y=-x", "y=x", False),
        ("x=1.44", "x=1.2^2", True),  # a decimal is the rational it writes
        ("x=1.52399022", "x=(1+.2345)^2", False),
        ("yz=2xz-5z", "y=2x-5", False),  # dividing by z adds the plane z = 0
        ("w(12.5-w)=25", "2w+50/w=25", True),
        ("(x-1)(x-2)=0", "x=1, x=2", True),  # a bare list in one variable lists solutions
        ("x=1", "[(x-1)(x+1)=0, (x-1)(x-3)=0]", True),  # a bracketed list is a system
        ("(x-1)(x+1)=0", "[x=1]", False),
        ("x>2 or x<-2", "x^2>4", True),
        ("x>1 and x<5", "5>x and 1<x", True),
        ("x^2>=4", "x^4>=16", True),  # a positive ratio x^2+4
        ("x>1", "x>=1", False),
        ("7", "3+4=7", True),
        ("7", "2=3+4", False),
        ("5=7+4", "2=3+4", False),
        ("x=1", "1=1", False),
        ("110.304=23^1.5", "23^1.5=110.304", True),
        ("p=5, q=2; p=7, q=2", "p=7, q=2; p=5, q=2", True),
        ("p=5, q=2; p=7, q=2", "p=5, q=2; p=7, q=3", False),
    ],
)
def test_relations(gold: str, pred: str, expected: bool) -> None:
    assert relation_equal(gold, pred) is expected


def test_no_opinion_without_a_relation_or_a_readable_side() -> None:
    assert relation_equal("2", "1+1") is None  # not a relation: math-verify's
    assert relation_equal("\\text{yes} = x", "x = \\text{yes}") is None  # a side that does not parse
    assert not is_relation("1, 2") and is_relation("x \\le 2") and is_relation("x == 2")
    relation = parse_relation("a=0 \\text{ or } b=0")
    assert relation is not None and relation.joint == "or" and len(relation.atoms) == 2
