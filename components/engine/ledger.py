"""The branch-aware token ledger of one response: generated tokens and KV entries, never over budget.

Every token appended to a response, by any branch, sampled or injected, is charged here before it is
appended. A fork is admitted only if the remaining budget covers a minimal step in every branch plus the
``<takeaway>`` that merges them; otherwise it is refused and decoding goes on sequentially.

Branches decode concurrently, possibly as separate server requests, so each is given an allowance up
front (``branch_allowances``): first what admission guaranteed it, then an equal share of the rest, like
NPR's ``len(branch) * n_branches`` budget rule. A branch that spends its allowance waits; when no branch
is running, what the finished ones left is shared among the waiting ones, round after round, so the whole
budget is usable and the result does not depend on which branch finished first.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class TokenLedger:
    """Budget of one sequence.

    Attributes:
        max_new_tokens: cap on response tokens summed over all branches.
        prompt_tokens: KV entries the prompt holds.
        kv_budget_tokens: cap on KV entries of this sequence (prompt + response), or None.
        used: response tokens charged so far.
    """

    max_new_tokens: int
    prompt_tokens: int = 0
    kv_budget_tokens: int | None = None
    used: int = 0

    @property
    def remaining(self) -> int:
        """Tokens that may still be appended (the tighter of the token and the KV budget)."""
        left = self.max_new_tokens - self.used
        if self.kv_budget_tokens is not None:
            left = min(left, self.kv_budget_tokens - self.prompt_tokens - self.used)
        return max(left, 0)

    @property
    def exhausted_reason(self) -> str:
        """Finish reason when the budget ends a response: ``length`` or ``kv_budget``, whichever binds (the
        one with fewer tokens left; ``length`` on a tie)."""
        if self.kv_budget_tokens is None:
            return "length"
        token_left = self.max_new_tokens - self.used
        kv_left = self.kv_budget_tokens - self.prompt_tokens - self.used
        return "length" if token_left <= kv_left else "kv_budget"

    def charge(self, n: int = 1) -> bool:
        """Charge ``n`` tokens if they fit; returns False (and charges nothing) if they do not."""
        if n > self.remaining:
            return False
        self.used += n
        return True

    def fork_cost(self, seed_lengths: list[int], min_step_tokens: int, merge_tokens: int = 1) -> int:
        """Tokens a fork must be able to spend: per branch its seed (``<step>`` + label), at least
        ``min_step_tokens`` of content and the closing ``</step>``, plus the merge (one ``<takeaway>``)."""
        return sum(n + min_step_tokens + 1 for n in seed_lengths) + merge_tokens

    def refuse_fork(self, seed_lengths: list[int], min_step_tokens: int, merge_tokens: int = 1) -> str | None:
        """None if the fork fits, else the reason it is refused."""
        cost = self.fork_cost(seed_lengths, min_step_tokens, merge_tokens)
        if cost <= self.remaining:
            return None
        token_left = self.max_new_tokens - self.used
        binding = "token budget" if token_left <= self.remaining else "kv budget"
        return f"{binding}: fork needs {cost} tokens, {self.remaining} left"


def branch_allowances(remaining: int, floors: list[int]) -> list[int]:
    """Split ``remaining`` tokens among branches: each gets its floor, then an equal share of the rest
    (the first ``extra % n`` one more). Floors that do not fit are cut in order (the caller admitted the
    fork, so with ``remaining`` from admission they always fit)."""
    out: list[int] = []
    left = remaining
    for f in floors:
        take = min(f, left)
        out.append(take)
        left -= take
    n = len(floors)
    if n and left > 0:
        share, rest = divmod(left, n)
        out = [a + share + (1 if j < rest else 0) for j, a in enumerate(out)]
    return out
