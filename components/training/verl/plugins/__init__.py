"""npr-pipeline's verl plugins: importing this package registers them in verl's own registries.

verl imports the package in every process of a job (``VERL_USE_EXTERNAL_MODULES``, set by
``components.training.verl.job`` in the Ray runtime env, and ``actor_rollout_ref.model.external_lib``):

| plugin | registry (key) | selected by |
|---|---|---|
| ``papo`` policy loss and advantage (``components.training.papo``) | ``POLICY_LOSS_REGISTRY`` / ``ADV_ESTIMATOR_REGISTRY`` (``papo``) | ``actor.policy_loss.loss_mode`` / ``algorithm.adv_estimator`` |
| ``engine.NPRParallelEngine``: canonical parallel mask, positions and prediction sources; post-merge correction | ``EngineRegistry`` (language_model, fsdp/fsdp2, cuda, vendor ``npr``) | ``VERL_ENGINE_VENDOR=npr`` |
| ``reward.TagKeepingRewardManager``: DAPO's manager decoding with tags kept | reward managers (``npr``) | ``reward.reward_manager.name`` |
| ``agent_loop.NPRParallelAgentLoop``: native fork/merge rollouts, structural filter, Stage-3 reward | agent loops (``npr_parallel``) | ``rollout.agent.default_agent_loop`` |
| ``cpu_platform.PlatformCPU``: verl's device calls answered for the CPU, gloo process groups | ``PlatformRegistry`` (``cpu``) | ``VERL_PLATFORM=cpu`` (``verl.device: cpu``) |
| the stock FSDP actor and the NPR actor under the ``cpu`` device key | ``EngineRegistry`` (language_model, fsdp/fsdp2, cpu) | the CPU platform's device name |
| ``torch_rollout``: ``TorchReplica`` / ``TorchRolloutServer`` (the project's torch token server) and ``TorchServerAdapter`` (weight sync) | ``RolloutReplicaRegistry`` and the rollout registry (``torch``) | ``rollout.name`` (``verl.rollout_name: torch``) |
| ``vllm_rollout``: ``VLLMServerReplica`` / ``VLLMRolloutServer`` (a stock vLLM server, given the trainer's weights after every update) and ``TorchServerAdapter`` | ``RolloutReplicaRegistry`` and the rollout registry (``vllm_server``) | ``rollout.name`` (``verl.rollout_name: vllm_server``) |

No verl file is edited; ``components.training.verl.validate.validate_job`` checks that a job selects them.
"""

# the platform first: it wraps verl's process-group setup before verl's workers import it
from components.training.verl.plugins import cpu_platform  # noqa: F401, I001  (registers on import)
from components.training import papo  # noqa: F401  (registers the papo loss and advantage)
from components.training.verl.plugins import agent_loop, engine, reward, torch_rollout, vllm_rollout  # noqa: F401
from components.training.verl.plugin_names import (
    AGENT_LOOP,
    ENGINE_VENDOR,
    ENGINE_VENDOR_ENV,
    PLUGIN_PACKAGE,
    REWARD_MANAGER,
    MERGE_ENV,
    SCHEMA_ENV,
)

__all__ = [
    "AGENT_LOOP",
    "ENGINE_VENDOR",
    "ENGINE_VENDOR_ENV",
    "PLUGIN_PACKAGE",
    "REWARD_MANAGER",
    "MERGE_ENV",
    "SCHEMA_ENV",
]
