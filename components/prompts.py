"""Prompt construction: our versioned instruction files, explicit separators, the chat template.

Every run records ``prompt_fingerprint`` so a metric can always be traced to the exact instruction text.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from components.settings import StrictModel


class PromptConfig(StrictModel):
    """The instruction files (ours, versioned) and how they are joined to a problem."""

    parallel_instruction: str = "prompts/npr_parallel_v1.txt"
    sequential_instruction: str = "prompts/sequential_v1.txt"
    # The Parallel-R1 recipe's instruction (pr1_coldstart, pr1_rl and their checkpoints in evaluate).
    parallel_r1_instruction: str = "prompts/pr1_parallel_v1.txt"
    # Separator between the problem text and the instruction inside the user turn.
    separator: str = "\n\n"
    system_prompt: str | None = None
    enable_thinking: bool = False


# parallel: the schema instruction of the pipeline (NPR); sequential: plain reasoning; parallel_r1: the
# Parallel-R1 recipe's instruction (its stages and checkpoints, whatever the pipeline's schema).
Style = Literal["parallel", "sequential", "parallel_r1"]
STYLES: tuple[str, ...] = ("parallel", "sequential", "parallel_r1")
_FIELD_OF_STYLE = {
    "parallel": "parallel_instruction",
    "sequential": "sequential_instruction",
    "parallel_r1": "parallel_r1_instruction",
}


@lru_cache(maxsize=16)
def _read(path: str) -> str:
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"prompt file {p} does not exist (prompts.* in params.yaml)")
    return p.read_text(encoding="utf-8").strip()


def instruction(prompts_cfg: PromptConfig, style: Style) -> str:
    """The instruction text for a style (``parallel`` = the schema instruction)."""
    if style not in _FIELD_OF_STYLE:
        raise ValueError(f"unknown prompt style {style!r}; known: {', '.join(STYLES)}")
    return _read(getattr(prompts_cfg, _FIELD_OF_STYLE[style]))


def prompt_fingerprint(prompts_cfg: PromptConfig) -> dict[str, str]:
    """sha256 of each instruction file and of the joining settings; recorded with every run."""
    out = {}
    for style in STYLES:
        out[f"{style}_sha256"] = hashlib.sha256(instruction(prompts_cfg, style).encode()).hexdigest()
    settings = f"{prompts_cfg.separator!r}|{prompts_cfg.system_prompt!r}|{prompts_cfg.enable_thinking!r}"
    out["settings_sha256"] = hashlib.sha256(settings.encode()).hexdigest()
    out["prompt_hash"] = hashlib.sha256("|".join(out[k] for k in sorted(out)).encode()).hexdigest()[:16]
    return out


def user_message(problem: str, prompts_cfg: PromptConfig, style: Style) -> str:
    """Problem, separator, instruction: the user turn (there is no system message unless configured)."""
    return problem.strip() + prompts_cfg.separator + instruction(prompts_cfg, style)


def chat_messages(problem: str, prompts_cfg: PromptConfig, style: Style) -> list[dict[str, str]]:
    messages = []
    if prompts_cfg.system_prompt:
        messages.append({"role": "system", "content": prompts_cfg.system_prompt})
    messages.append({"role": "user", "content": user_message(problem, prompts_cfg, style)})
    return messages


def render_prompt(tokenizer: Any, problem: str, prompts_cfg: PromptConfig, style: Style) -> str:
    """The full prompt text up to and including the assistant header (generation prompt)."""
    return tokenizer.apply_chat_template(
        chat_messages(problem, prompts_cfg, style),
        tokenize=False,
        add_generation_prompt=True,
        enable_thinking=prompts_cfg.enable_thinking,
    )
