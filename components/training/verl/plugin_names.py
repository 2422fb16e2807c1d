"""The names under which the plugins register in verl, the names of verl's functions each RL algorithm
trains with, and the environment the launcher sets for them.

Kept apart from the plugin modules (and outside the ``plugins`` package, whose import registers the plugins
and so imports verl) so the job builder (``job``), the local trainer's objective (``rl_objective``) and the
plugins read one definition, and building a job imports no verl (tests/unit/training/test_verl_imports.py).
"""

from __future__ import annotations

# verl's registry names of the policy loss and advantage estimator each `algorithm` trains with. DAPO's are
# verl's own (decoupled-clip "vanilla" loss, "grpo" group-normalised advantage); PAPO's are registered by
# components.training.papo.
DAPO_POLICY_LOSS = "vanilla"
DAPO_ADV_ESTIMATOR = "grpo"
PAPO_NAME = "papo"
# algorithm -> (verl advantage estimator, verl policy loss)
ALGORITHMS: dict[str, tuple[str, str]] = {
    "dapo": (DAPO_ADV_ESTIMATOR, DAPO_POLICY_LOSS),
    # GRPO as Parallel-R1 runs it: the same verl functions, no dynamic sampling (the trainers' concern)
    "grpo": (DAPO_ADV_ESTIMATOR, DAPO_POLICY_LOSS),
    "papo": (PAPO_NAME, PAPO_NAME),
}


def verl_names(algorithm: str) -> tuple[str, str]:
    """(advantage estimator, policy loss) registered in verl for ``algorithm``."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown RL algorithm {algorithm!r}; known: {sorted(ALGORITHMS)}")
    return ALGORITHMS[algorithm]

# The module verl imports in every process (VERL_USE_EXTERNAL_MODULES, model.external_lib): the package
# itself, whose import registers every plugin below.
PLUGIN_PACKAGE = "components.training.verl.plugins"

# EngineRegistry key of the NPR actor: EngineRegistry.get_engine_cls picks it when VERL_ENGINE_VENDOR is set
# to this value (the device part of the key stays the real device, "cuda").
ENGINE_VENDOR = "npr"
ENGINE_VENDOR_ENV = "VERL_ENGINE_VENDOR"
ENGINE_DEVICES = ("cuda", "npu", "cpu")

# verl's reward-manager registry (reward.reward_manager.name): DAPO's manager that decodes with tags kept.
REWARD_MANAGER = "npr"

# verl's agent-loop registry (actor_rollout_ref.rollout.agent.default_agent_loop): native fork/merge rollouts.
AGENT_LOOP = "npr_parallel"

# The structure schema the NPR actor and the agent loop parse (set from params.yaml's schema_name).
SCHEMA_ENV = "NPR_SCHEMA"
DEFAULT_SCHEMA = "npr"

# The merge semantics the NPR actor's forward lays out (set from params.yaml's merge_semantics).
MERGE_ENV = "NPR_MERGE_SEMANTICS"
DEFAULT_MERGE = "isolated"

# The CPU platform (plugins.cpu_platform) and verl's variable that selects a platform by name.
CPU_PLATFORM = "cpu"
PLATFORM_ENV = "VERL_PLATFORM"

# The replay buffer of every verl RL stage (trainer.v1.sampler.custom_sampler, plugins.replay).
REPLAY_MODULE = "components.training.verl.plugins.replay"
REPLAY_SAMPLER = "BoundedReplayBuffer"

# verl's rollout names (rollout.name) of the project's CPU rollouts: the torch token server inside the job
# (plugins.torch_rollout) and a stock vLLM server given the trainer's weights (plugins.vllm_rollout).
TORCH_ROLLOUT = "torch"
SERVED_ROLLOUT = "vllm_server"
CPU_ROLLOUTS = (TORCH_ROLLOUT, SERVED_ROLLOUT)
# rollout.custom's keys of a served rollout job (the launcher writes them, the rollout's server actor reads them)
SERVED_SPEC_KEY = "npr_server_spec"
SERVED_START_TIMEOUT_KEY = "npr_server_start_timeout_s"
SERVED_WORK_DIR_KEY = "npr_server_work_dir"
