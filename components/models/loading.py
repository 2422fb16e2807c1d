"""Loading and saving causal LMs with their tokenizers: one function each, used by every stage.

``load_model`` takes a local Hugging Face directory (what every stage writes) or a hub id (the qwen3-4b
profile's ``models.base_model``, fetched as a user online would; cached afterwards). Weights are read from
safetensors only and remote code is never executed. ``save_model`` writes a directory with config.json,
model.safetensors, generation_config.json and the tokenizer files (chat template included) that this module,
SGLang and verl all load.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

from components.errors import UserError
from components.models.config import ModelsConfig
from components.settings import RunConfig

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class ModelLoadError(UserError, RuntimeError):
    """The model or tokenizer could not be loaded; says from where and why."""


def resolve_dtype(run_cfg: RunConfig) -> torch.dtype:
    """``run.dtype`` as a torch dtype."""
    return DTYPES[run_cfg.dtype]


def resolve_device(run_cfg: RunConfig) -> torch.device:
    """``run.device``; ``auto`` picks CUDA when present. Asking for CUDA on a machine without it raises."""
    if run_cfg.device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if run_cfg.device == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError("run.device is 'cuda' but no CUDA device is available (use 'cpu' or 'auto')")
    return torch.device(run_cfg.device)


def is_local_model_dir(path_or_name: str | Path) -> bool:
    return Path(path_or_name).is_dir()


def looks_like_hub_id(path_or_name: str | Path) -> bool:
    """``name`` or ``owner/name`` (hub ids have at most one slash and are not relative/absolute paths)."""
    text = str(path_or_name)
    return not text.startswith((".", "/", "~")) and text.count("/") <= 1 and bool(text.strip())


def load_tokenizer(path_or_name: str | Path) -> Any:
    """The tokenizer of a model directory or hub id (never with remote code)."""
    try:
        return AutoTokenizer.from_pretrained(str(path_or_name), trust_remote_code=False)
    except (OSError, ValueError) as err:
        raise ModelLoadError(_explain(path_or_name, "tokenizer", err)) from err


def load_model(
    path_or_name: str | Path, models_cfg: ModelsConfig, run_cfg: RunConfig, for_training: bool = False
) -> tuple[PreTrainedModel, Any]:
    """Load ``(model, tokenizer)`` from a local HF directory or a hub id.

    dtype and device come from ``run_cfg`` (``run`` section), the attention implementation from
    ``models_cfg`` (``models.attn_implementation``). ``for_training`` puts the model in train mode with the
    KV cache off (the cache is useless in a training forward and changes how transformers reads
    non-monotonic position ids, stack-ml.md §2 pitfall 3); otherwise eval mode.
    """
    if not is_local_model_dir(path_or_name) and not looks_like_hub_id(path_or_name):
        raise ModelLoadError(f"model directory {path_or_name} does not exist")
    tokenizer = load_tokenizer(path_or_name)
    try:
        model = AutoModelForCausalLM.from_pretrained(
            str(path_or_name),
            dtype=resolve_dtype(run_cfg),
            attn_implementation=models_cfg.attn_implementation,
            use_safetensors=True,
            trust_remote_code=False,
        )
    except (OSError, ValueError) as err:
        raise ModelLoadError(_explain(path_or_name, "model", err)) from err
    model.to(resolve_device(run_cfg))
    if for_training:
        model.train()
        model.config.use_cache = False
    else:
        model.eval()
    return model, tokenizer


def save_model(
    model: PreTrainedModel, tokenizer: Any, path: str | Path, state_dict: dict[str, Any] | None = None
) -> Path:
    """Write model (safetensors), generation config and tokenizer to ``path``; returns the path.

    ``use_cache`` is restored to True in the saved config, so inference servers get their default.
    ``state_dict``: the weights to write instead of the module's own (the gathered state of an FSDP model).
    """
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    use_cache = model.config.use_cache
    model.config.use_cache = True
    try:
        model.save_pretrained(path, state_dict=state_dict)
    finally:
        model.config.use_cache = use_cache
    if state_dict is not None:
        _record_saved_dtype(path, state_dict)
    tokenizer.save_pretrained(path)
    if not (path / "model.safetensors").exists() and not (path / "model.safetensors.index.json").exists():
        raise ModelLoadError(f"save_pretrained did not write safetensors weights into {path}")
    return path


def _record_saved_dtype(path: Path, state_dict: dict[str, Any]) -> None:
    """config.json names the dtype of the tensors written, not of the module that wrote them (an FSDP
    mixed-precision run holds fp32 masters and writes its bf16 weights; save_pretrained says float32)."""
    dtypes = {v.dtype for v in state_dict.values() if isinstance(v, torch.Tensor) and v.is_floating_point()}
    if len(dtypes) != 1:
        return
    name = str(dtypes.pop()).removeprefix("torch.")
    config_path = path / "config.json"
    config = json.loads(config_path.read_text())
    if config.get("dtype") != name:
        config["dtype"] = name
        config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def _explain(path_or_name: str | Path, what: str, err: Exception) -> str:
    where = (
        f"local directory {path_or_name}" if is_local_model_dir(path_or_name) else f"hub id {path_or_name!r}"
    )
    hint = (
        ""
        if is_local_model_dir(path_or_name)
        else " (not a local directory; if the hub is unreachable (HF_HUB_OFFLINE=1) it must already be cached)"
    )
    return f"could not load the {what} from {where}{hint}: {err}"
