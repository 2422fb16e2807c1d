"""What every rollout of a verl job came to, written by the plugins that see it, read by the stage.

verl's per-step metrics have no format or correctness rates of the training rollouts (its reward
``reward_extra_info`` is kept per sample, not aggregated for training steps), and nothing about rollouts the
structural filter dropped. The plugins that score rollouts append one record per rollout here: the
``npr_parallel`` agent loop (every rollout, dropped ones with their reason) and the ``npr`` reward manager
(every rollout of the stages it scores). ``components.training.verl.stage`` reads them after the job and
reports the local trainer's ``rollout/*`` rates per step from them.

One file per process (``rollouts-<pid>.jsonl`` in ``$NPR_VERL_ROLLOUT_LOG_DIR``, which the stage sets), one
JSON object per line, appended and flushed per record, so concurrent workers never interleave and a killed
job keeps what it wrote. Without the variable nothing is written (a job launched by hand).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

LOG_DIR_ENV = "NPR_VERL_ROLLOUT_LOG_DIR"
# The job attempt (1, 2, ... after resumes) the stage launched; records carry it so a replayed step counts once.
ATTEMPT_ENV = "NPR_VERL_ATTEMPT"


def log_rollout(record: dict[str, Any]) -> None:
    """Append one rollout's record (``step``, ``held_out``, ``valid``, ``correct``, ``parallel``, ``rejected``,
    ``tokens``), tagged with the attempt."""
    folder = os.environ.get(LOG_DIR_ENV)
    if not folder:
        return
    record = {"attempt": int(os.environ.get(ATTEMPT_ENV, "0")), **record}
    path = Path(folder) / f"rollouts-{os.getpid()}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps(record, sort_keys=True, default=float) + "\n")


def read_rollouts(folder: Path) -> Iterator[dict[str, Any]]:
    """Every record under ``folder`` (a line cut short by a kill is skipped)."""
    for path in sorted(Path(folder).glob("rollouts-*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                continue


__all__ = ["ATTEMPT_ENV", "LOG_DIR_ENV", "log_rollout", "read_rollouts"]
