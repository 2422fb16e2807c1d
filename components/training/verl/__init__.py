"""The GPU RL path: an RL stage trained by verl 0.9.1's own ``main_ppo``, on GPUs or (tiny profile) on CPU.

One package, one job per module:

| module | what it does |
|---|---|
| ``stage`` | the stage body for ``<stage>.backend: verl``: the job prepared (built, validated, its inputs written), run as attempt ``k``, resumed from its checkpoints, the last one merged into the stage's output, verl's own metrics reported |
| ``job`` | building the job, once: ``verl_job`` turns the stage's ``RLJob`` (its section and the shared settings, read once by ``components.training.job.rl_job``) into a ``VerlJob`` (Hydra overrides, input paths, plugin environment, reward settings); parquet inputs and the job's record from it |
| ``plugin_names`` | the names the plugins register under in verl, verl's function names of each RL algorithm, the environment variables the launcher sets: read by the job, the plugins and the local objective without importing verl |
| ``validate`` | validation as a function of the built job: ``validate_job`` (verl's own validation, every plugin the job names resolved) and ``check_inputs`` (the prompts against the model's tokenizer) |
| ``launch`` | running the built job: the driver's argv and environment, a Ray head of its own or the cluster a submitted job runs in; ``npr verl launch`` (validate and show, or submit the stage to ``verl.ray_address``) |
| ``ray_cluster`` | where it runs: a Ray head the stage starts and stops itself, or a running cluster it submits to |
| ``plugins`` | what verl imports in every process of the job (``VERL_USE_EXTERNAL_MODULES``): the PAPO loss and advantage, the NPR actor engine, the tag-keeping reward manager, the ``npr_parallel`` agent loop, and the CPU platform with its ``torch`` rollout |

Nothing in verl is edited: every plugin goes through one of verl's registries or extension points.

The package is entered lazily: ``components.training.rl`` (when a stage's backend is verl), ``npr verl
launch`` and ``npr config check`` import it inside the function that needs it, so the local trainer never
imports verl's trainer stack. Inside it, ``validate`` (and the plugins) import verl's code at module top;
``job`` neither calls nor imports it (its overrides are strings): it reads the plugins' names from
``plugin_names``, outside the ``plugins`` package, whose import registers the plugins in verl
(tests/unit/training/test_verl_imports.py).
"""
