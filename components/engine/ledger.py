"""The branch-aware token ledger of one response: generated tokens and KV entries, never over budget.

Every token appended to a response, by any branch, sampled or injected, is charged here before it is
appended. A fork is admitted only if the remaining budget covers a minimal step in every branch plus the
``<takeaway>`` that merges them; otherwise it is refused and decoding goes on sequentially. This replaces
NPR's estimate ``tokens_so_far + len(branch) * n_branches`` (which can overshoot when branches differ in
length) with an exact count.
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
        """Finish reason once ``remaining`` is 0: ``length`` or ``kv_budget`` (whichever binds)."""
        if self.used >= self.max_new_tokens:
            return "length"
        return "kv_budget"

    def charge(self, n: int = 1) -> bool:
        """Charge ``n`` tokens if they fit; returns False (and charges nothing) if they do not."""
        if n > self.remaining:
            return False
        self.used += n
        return True

    def fork_cost(self, seed_lengths: list[int], min_step_tokens: int) -> int:
        """Tokens a fork must be able to spend: per branch its seed (``<step>`` + label), at least
        ``min_step_tokens`` of content and the closing ``</step>``, plus one ``<takeaway>``."""
        return sum(n + min_step_tokens + 1 for n in seed_lengths) + 1

    def refuse_fork(self, seed_lengths: list[int], min_step_tokens: int) -> str | None:
        """None if the fork fits, else the reason it is refused."""
        cost = self.fork_cost(seed_lengths, min_step_tokens)
        if cost <= self.remaining:
            return None
        token_left = self.max_new_tokens - self.used
        binding = "token budget" if token_left <= self.remaining else "kv budget"
        return f"{binding}: fork needs {cost} tokens, {self.remaining} left"
