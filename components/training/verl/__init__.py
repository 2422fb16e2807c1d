"""The GPU RL path: an RL stage trained by verl 0.9.1's own ``main_ppo``, on GPUs or (tiny profile) on CPU.

One package, one job per module:

| module | what it does |
|---|---|
| ``stage`` | the stage body for ``<stage>.backend: verl``: write the job's inputs, run ``main_ppo`` on Ray, resume from the job's checkpoints, merge the last one into the stage's output, report verl's own metrics |
| ``launch`` | the job: Hydra overrides from the typed config, parquet inputs, the Ray job command, ``validate_job`` (verl's own validation and every plugin the job names resolved) |
| ``ray_cluster`` | where it runs: a Ray head the stage starts and stops itself, or a running cluster it submits to |
| ``plugins`` | what verl imports in every process of the job (``VERL_USE_EXTERNAL_MODULES``): the PAPO loss and advantage, the NPR actor engine, the tag-keeping reward manager, the ``npr_parallel`` agent loop, and the CPU platform with its ``torch`` rollout |

Nothing in verl is edited: every plugin goes through one of verl's registries or extension points.

Imports here stay lazy: ``components.training.rl`` reaches this package only when a stage's backend is
verl, so the local trainer never imports verl's trainer stack.
"""
