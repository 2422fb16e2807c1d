"""A local PAPO step with re-prefilled merges: the torch engine's ``reprefill`` mode plus the correction.

What the merge measurement runs (issue 14 item 5): the same trainer as the tiny recipe, whose rollouts
continue after each block as an SGLang server would; tokens before the first merge are exact, those after
it are reweighted, and the two mismatches are reported apart.
"""

from __future__ import annotations

import pytest

from components.config import load_config
from components.data.synthetic import generate_problems
from components.training.job import rl_job
from components.training.rl import RLTrainer

pytestmark = pytest.mark.slow

# every parallel decode re-reads its merges: what merge_semantics reread requires
REREAD = [
    "merge_semantics=reread",
    *(f"{k}=reprefill" for k in ("papo_rl.merge_mode", "evaluate.generation.merge_mode", "pr1_rl.merge_mode")),
]


def _reprefill_papo_step(warm_world, tmp_path, *overrides: str) -> tuple[dict, object]:
    """One local PAPO step of re-prefilled rollouts from the warm tiny model; (step metrics, config)."""
    model, tok = warm_world
    cfg = load_config(
        profile="tiny",
        overrides=[
            "papo_rl.merge_mode=reprefill",
            "papo_rl.steps=1",
            "papo_rl.prompts_per_step=8",
            "papo_rl.group_size=4",
            "papo_rl.max_new_tokens=160",
            "papo_rl.eval_before_train=false",
            # fp32 compute: the pre-merge tokens' trainer log-probs are checked against the fp32 engine's
            "run.autocast=null",
            *overrides,
        ],
    )
    cfg.tracking.mode = "disabled"
    ps = generate_problems(12, seed=21, weights={"easy": 1.0})  # the warm-up's (shortest) traces
    trainer = RLTrainer(rl_job("papo_rl", cfg), model, tok, ps[:8], ps[8:], tmp_path)
    return trainer.train_step(), cfg


def test_a_reprefill_papo_step_reports_exact_branches_and_corrects_post_merge_tokens(warm_world, tmp_path):
    step, cfg = _reprefill_papo_step(warm_world, tmp_path)
    assert step["train/rollouts_trained"] > 0
    assert step["rollout_corr/post_merge_token_frac"] > 0, "some trained rollouts merged a block"
    # tokens sampled before the first merge (plans, the first block's branches) are exact
    assert step["rollout_corr/pre_merge_abs_logp_diff_max"] <= 1e-4
    # after it the engine read the branches as one sequential text: a real mismatch, then reweighted
    assert step["rollout_corr/post_merge_abs_logp_diff_mean"] > 1e-3
    assert 0 < step["rollout_corr/post_merge_is_weight_mean"] <= cfg.papo_rl.rollout_correction.is_threshold


def test_under_reread_semantics_the_trainer_is_the_reprefilled_engine_and_the_correction_a_no_op(
    warm_world, tmp_path
):
    """The same re-prefilled rollouts, trained under ``merge_semantics: reread``: the trainer's forward lays
    out the re-read (components.structure.merge), so every token, post-merge ones included, has the
    engine's log-prob and PAPO's weights are 1."""
    step, _ = _reprefill_papo_step(warm_world, tmp_path, *REREAD)
    assert step["train/rollouts_trained"] > 0
    assert step["rollout_corr/post_merge_token_frac"] > 0, "some trained rollouts merged a block"
    assert step["rollout_corr/pre_merge_abs_logp_diff_max"] <= 1e-4
    assert step["rollout_corr/post_merge_abs_logp_diff_mean"] <= 1e-5
    assert step["rollout_corr/post_merge_abs_logp_diff_p99"] <= 1e-4
    assert step["rollout_corr/post_merge_is_weight_mean"] == pytest.approx(1.0, abs=1e-4)
    assert step["rollout_corr/post_merge_is_truncated_frac"] == 0.0


def test_reread_semantics_refuses_a_shared_kv_decode():
    from components.errors import UserError

    with pytest.raises((UserError, ValueError), match="papo_rl.merge_mode"):
        load_config(profile="tiny", overrides=["merge_semantics=reread"])


def test_reread_semantics_refuses_the_isolated_merge_plugin():
    from components.errors import UserError

    load_config(profile="tiny", overrides=REREAD)  # consistent: loads
    plugin = ["evaluate.generation.backend=sglang", "evaluate.generation.sglang_isolated_merge=true"]
    with pytest.raises((UserError, ValueError), match="evaluate.generation.sglang_isolated_merge"):
        load_config(profile="tiny", overrides=[*REREAD, *plugin])
