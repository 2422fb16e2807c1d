"""Run a warmup stage function in this process (alone, or as one rank of a torchrun job).

    python warmup_fsdp_worker.py ROOT STAGE OUT_DIR

ROOT holds ``seed/model`` and ``reject_filter/accepted`` (made by the test); the stage writes OUT_DIR/model.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from components.config import load_config
from components.dag import StageIO
from components.stages import parallel_warmup, sequential_warmup


def main() -> None:
    root, stage, out = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
    torch.set_num_threads(1)
    overrides = [
        f"{stage}.max_steps=3",
        f"{stage}.batch_size=4",
        f"{stage}.lr=1e-3",
        "tracking.mode=disabled",
        # fp32 compute: the test compares the 2-rank model with the 1-rank one to 1e-5, below bf16 rounding
        "run.autocast=null",
    ]
    cfg = load_config(profile="tiny", overrides=overrides)
    io = StageIO(
        stage=stage,
        inputs={
            "seed/model": root / "seed" / "model",
            "reject_filter/accepted": root / "reject_filter" / "accepted",
        },
        outputs={"model": out / "model"},
    )
    module = {"parallel_warmup": parallel_warmup, "sequential_warmup": sequential_warmup}[stage]
    module.run(cfg, io)


if __name__ == "__main__":
    main()
