"""The GPU RL path: an RL stage trained by verl 0.9.1's own ``main_ppo``, on GPUs or (tiny profile) on CPU.

One package, one job per module:

| module | what it does |
|---|---|
| ``stage`` | the stage body for ``<stage>.backend: verl``: write the job's inputs, run ``main_ppo`` on Ray, resume from the job's checkpoints, merge the last one into the stage's output, report verl's own metrics |
| ``launch`` | the job: Hydra overrides from the typed config, parquet inputs, the Ray job command, ``validate_job`` (verl's own validation and every plugin the job names resolved) |
| ``ray_cluster`` | where it runs: a Ray head the stage starts and stops itself, or a running cluster it submits to |
| ``plugins`` | what verl imports in every process of the job (``VERL_USE_EXTERNAL_MODULES``): the PAPO loss and advantage, the NPR actor engine, the tag-keeping reward manager, the ``npr_parallel`` agent loop, and the CPU platform with its ``torch`` rollout |

Nothing in verl is edited: every plugin goes through one of verl's registries or extension points.

The package is entered lazily: ``components.training.rl`` (when a stage's backend is verl), ``npr verl
launch`` and ``npr config check`` import it inside the function that needs it, so the local trainer never
imports verl's trainer stack. Inside it, ``launch`` imports verl, Hydra and transformers at module top.
"""
