"""Answer grading and rewards.

``answers.extract_answer`` -> ``equivalence.answers_equal`` / ``grade_many`` (fast path, then math-verify in a
process pool) -> ``judge.judge`` / ``judge_many`` / ``summarize`` -> ``rewards`` (registered by name) and
``verl_reward.compute_score`` (verl's custom reward entry point). Nothing is imported here so pool workers,
which import ``components.grading.mv_worker``, stay light.
"""
