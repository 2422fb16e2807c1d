"""The Prefect flows. Importing this package first applies what every flow process needs, however it was
started (``components.env.apply_prefect_defaults``): no telemetry, and the running `npr server` when
there is one (before ``prefect`` reads its settings)."""

from components.env import apply_prefect_defaults

apply_prefect_defaults()
