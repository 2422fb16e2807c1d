"""Stands in for ``verl.trainer.main_ppo`` in CPU tests of the Ray path (``NPR_VERL_ENTRY_MODULE``).

It takes the launcher's Hydra overrides, attaches to the Ray cluster named by ``RAY_ADDRESS`` as verl's
driver does, has a Ray worker read the paths and environment a real trainer's workers would need, and
writes one line per step where verl's file logger writes (``VERL_FILE_LOGGER_PATH``, the format of
``verl.utils.tracking.FileLogger``) and a world-size-1 FSDP checkpoint of the starting model where verl
writes its checkpoints, so the stage's report and verl's real model merger read what a real job leaves.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import ray
import torch


def _overrides(argv: list[str]) -> dict[str, str]:
    return dict(a.lstrip("+").split("=", 1) for a in argv if "=" in a)


@ray.remote
def probe(model_path: str, train_files: str, val_files: str) -> dict:
    import pandas as pd

    config = json.loads((Path(model_path) / "config.json").read_text())
    keys = ("WANDB_API_KEY", "WANDB_MODE", "AWS_ACCESS_KEY_ID", "AWS_ENDPOINT_URL", "NPR_PIPELINE_RUN_ID")
    return {
        "node": ray.get_runtime_context().get_node_id(),
        "pid": os.getpid(),
        "hidden_size": config["hidden_size"],
        "train_rows": len(pd.read_parquet(train_files)),
        "val_rows": len(pd.read_parquet(val_files)),
        "env": {k: os.environ.get(k) for k in keys},
    }


def main(argv: list[str]) -> int:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ov = _overrides(argv)
    ray.init()  # RAY_ADDRESS, as verl's main_ppo when a cluster is running
    found = ray.get(
        probe.remote(ov["actor_rollout_ref.model.path"], ov["data.train_files"], ov["data.val_files"])
    )
    found["driver_pid"] = os.getpid()
    steps = int(ov["trainer.total_training_steps"])
    with open(os.environ["VERL_FILE_LOGGER_PATH"], "w", encoding="utf-8") as log:
        for step in range(1, steps + 1):  # the stand-in trains nothing: a zero score, as in verl's log format
            log.write(json.dumps({"step": step, "data": {"critic/score/mean": 0.0, "timing_s/step": 0.1}}) + "\n")
    checkpoints = Path(ov["trainer.default_local_dir"])
    actor = checkpoints / f"global_step_{ov['trainer.total_training_steps']}" / "actor"
    (actor / "huggingface").mkdir(parents=True, exist_ok=True)
    model = AutoModelForCausalLM.from_pretrained(ov["actor_rollout_ref.model.path"])
    torch.save(model.state_dict(), actor / "model_world_size_1_rank_0.pt")
    (actor / "fsdp_config.json").write_text(json.dumps({"FSDP_version": 2, "world_size": 1}))
    model.config.save_pretrained(actor / "huggingface")
    AutoTokenizer.from_pretrained(ov["actor_rollout_ref.model.path"]).save_pretrained(actor / "huggingface")
    (checkpoints.parent / "standin_probe.json").write_text(json.dumps(found))
    ray.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
