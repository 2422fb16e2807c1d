"""EXPERIMENTAL SGLang plugin: NPR's ``isolated`` merge (the trainer's sibling-blind mask and shared
positions) on a stock SGLang 0.5.12 server, through its plugin hooks; no fork of SGLang.

Registered as the entry point ``npr_isolated_merge`` of group ``sglang.srt.plugins`` (pyproject.toml), so
every SGLang process of an environment where this project is installed loads it. It is OFF unless the
server's environment has ``NPR_SGLANG_ISOLATED_MERGE=1`` (``register`` then returns without importing
sglang or registering anything); even when on it touches only requests a client marked with
``sglang_isolated.request_fields`` (SGLang's ``extra_key`` and ``sampling_params.custom_params``).

When on, it registers three hooks (SGLang's ``HookRegistry``):

- AROUND ``mem_cache.radix_cache.RadixCache.match_prefix``: a marked request gets its own radix namespace
  (``extra_key``, so its KV never serves a stock request with the same ids), its canonical inputs are
  computed (``sglang_isolated.canonical_inputs``) and kept on the request, and the match is cut back to
  the longest usable prefix (a merge whose first branch is cached: the fork point).
- AFTER ``model_executor.forward_batch_info.ForwardBatch.init_new``: the canonical positions of the tokens
  an extend computes; a decode subtracts the request's constant offset (CUDA-graph decode copies
  ``forward_batch.positions``); the extend's mask rows are kept on the batch when any row is not causal.
- AFTER ``layers.attention.triton_backend.TritonAttnBackend.init_forward_metadata``: those rows installed as
  ``custom_mask`` / ``mask_indptr`` (the layout speculative verification uses), the kernel called with
  ``skip_prefix_custom_mask=False`` for that batch.

SGLang logs and swallows both a plugin's exceptions and a hook that failed to apply (a target renamed in
a new release), so a server would silently serve ``reprefill`` semantics to requests that asked for
``isolated``. ``register`` therefore wraps the registry's ``apply_hooks`` (which SGLang calls once, after
every plugin registered) with a check that each of the three targets now runs this plugin's hook, and ends
the process with ``SystemExit`` (which SGLang's ``except Exception`` does not catch) when one does not; the
"ON" line is logged only after that check.

The server needs ``--attention-backend triton --page-size 1 --disable-piecewise-cuda-graph`` and no
speculative decoding (``components.ops.launch.with_isolated_merge`` adds them and the environment flag
to a launched server's spec when ``generation.sglang_isolated_merge`` is on). EXPERIMENTAL until a GPU run
shows its tokens and log-probs equal the torch engine's ``shared_kv`` merge.
"""

from __future__ import annotations

import dataclasses
import logging
import pkgutil
from typing import Any

import torch

from components.engine.backends import sglang_isolated as iso

logger = logging.getLogger(__name__)

REQ_ATTR = "_npr_isolated_inputs"  # the CanonicalInputs kept on an SGLang Req
BATCH_ATTR = "_npr_isolated_mask"  # (custom_mask, mask_indptr) kept on a ForwardBatch
METADATA_ATTR = "_npr_isolated"  # set on the triton backend's ForwardMetadata it installed a mask in

MATCH_PREFIX = "sglang.srt.mem_cache.radix_cache.RadixCache.match_prefix"
INIT_NEW = "sglang.srt.model_executor.forward_batch_info.ForwardBatch.init_new"
INIT_METADATA = "sglang.srt.layers.attention.triton_backend.TritonAttnBackend.init_forward_metadata"


def around_match_prefix(original: Any, cache: Any, *args: Any, **kwargs: Any) -> Any:
    params = kwargs.pop("params") if "params" in kwargs else args[0]
    req = getattr(params, "req", None)
    marked = _marked(req)
    if marked is None:
        return original(cache, params)
    start, tags = marked
    inputs = iso.canonical_inputs(list(req.origin_input_ids) + list(req.output_ids), tags, start)
    setattr(req, REQ_ATTR, inputs)
    namespace = iso.namespace_key(start, req.extra_key)
    if inputs is None:  # served as a stock request, in a namespace of its own: its KV is not canonical
        logger.warning(
            "npr isolated merge: request %s has malformed tags; served as a stock request", req.rid
        )
        namespace += iso.MALFORMED
    key = params.key
    if req.extra_key != namespace or key.extra_key != namespace:
        req.extra_key = namespace
        key = type(key)(list(key.token_ids), namespace)
        params = dataclasses.replace(params, key=key)
    result = original(cache, params)
    if inputs is None:
        return result
    matched = len(result.device_indices)
    cut = inputs.cut_point(matched)
    if cut == matched:
        return result
    return original(cache, dataclasses.replace(params, key=key[:cut]))


def after_init_new(forward_batch: Any, cls: Any, *args: Any, **kwargs: Any) -> None:
    batch = kwargs["batch"] if "batch" in kwargs else args[0]
    inputs = [getattr(req, REQ_ATTR, None) for req in batch.reqs or ()]
    if all(i is None for i in inputs):
        return
    mode = forward_batch.forward_mode
    positions = forward_batch.positions
    if mode.is_decode():
        offsets = [i.offset if i is not None else 0 for i in inputs]
        forward_batch.positions = positions - iso_tensor(offsets, positions)
    elif mode.name in ("EXTEND", "MIXED"):
        new_positions, rows = iso_extend(inputs, batch.extend_prefix_lens, batch.extend_seq_lens)
        forward_batch.positions = new_positions.to(device=positions.device, dtype=positions.dtype)
        if rows is not None:
            setattr(forward_batch, BATCH_ATTR, iso.batch_custom_mask(rows, positions.device))


def after_init_forward_metadata(result: Any, backend: Any, *args: Any, **kwargs: Any) -> None:
    forward_batch = kwargs["forward_batch"] if "forward_batch" in kwargs else args[0]
    stash = getattr(forward_batch, BATCH_ATTR, None)
    if stash is None or forward_batch.forward_mode.name not in ("EXTEND", "MIXED"):
        return
    metadata = backend.forward_metadata
    metadata.custom_mask, metadata.mask_indptr = stash
    setattr(metadata, METADATA_ATTR, True)
    if not getattr(backend.extend_attention_fwd, METADATA_ATTR, False):
        backend.extend_attention_fwd = _prefix_masked(backend, backend.extend_attention_fwd)


def _prefix_masked(backend: Any, kernel: Any) -> Any:
    """The backend's extend kernel, applying the custom mask over the cached prefix too when the plugin
    installed the mask (a chunked prefill's later chunk has its earlier chunks as prefix)."""

    def call(*args: Any, **kwargs: Any) -> Any:
        if getattr(backend.forward_metadata, METADATA_ATTR, False):
            kwargs["skip_prefix_custom_mask"] = False
        return kernel(*args, **kwargs)

    setattr(call, METADATA_ATTR, True)
    return call


def iso_tensor(values: list[int], like: Any) -> Any:
    return torch.tensor(values, dtype=like.dtype).to(like.device)


def iso_extend(
    inputs: list[iso.CanonicalInputs | None], prefix_lens: list[int], extend_lens: list[int]
) -> tuple[Any, list[Any] | None]:
    """Positions (long[sum extend]) of an extend batch and, when any row is not causal, every request's
    mask rows (causal for unmarked requests); None otherwise."""
    positions, masked = [], False
    for inp, p, e in zip(inputs, prefix_lens, extend_lens, strict=True):
        if inp is None:
            positions.append(torch.arange(p, p + e, dtype=torch.long))
        else:
            positions.append(inp.extend_positions(p, e))
            masked |= not inp.rows_are_causal(p, e)
    rows = None
    if masked:
        rows = [
            inp.mask_rows(p, e) if inp is not None else torch.ones(e, p + e, dtype=torch.bool).tril_(p)
            for inp, p, e in zip(inputs, prefix_lens, extend_lens, strict=True)
        ]
    return torch.cat(positions) if positions else torch.zeros(0, dtype=torch.long), rows


def _marked(req: Any) -> tuple[int, iso.TagIds] | None:
    if req is None:
        return None
    sampling = getattr(req, "sampling_params", None)
    try:
        return iso.parse_request_params(getattr(sampling, "custom_params", None))
    except ValueError as err:
        logger.warning("npr isolated merge: %s; served as a stock request", err)
        return None


HOOKS = (
    (MATCH_PREFIX, "AROUND", around_match_prefix),
    (INIT_NEW, "AFTER", after_init_new),
    (INIT_METADATA, "AFTER", after_init_forward_metadata),
)


VERIFIED_ATTR = "_npr_isolated_verified"  # marks the registry's apply_hooks once wrapped with the check


def register() -> None:
    """Entry point of group ``sglang.srt.plugins``: registers ``HOOKS`` when ``NPR_SGLANG_ISOLATED_MERGE=1``,
    and does nothing (imports no sglang) otherwise. The registry's ``apply_hooks`` then checks they applied."""
    if not iso.enabled():
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType  # lazy: sglang

    for target, kind, hook in HOOKS:
        HookRegistry.register(target, hook, HookType[kind])
    _check_after_apply(HookRegistry)
    logger.info("npr isolated merge plugin: hooks registered on %s", ", ".join(t for t, _, _ in HOOKS))


def _check_after_apply(registry: Any) -> None:
    apply_hooks = registry.apply_hooks
    if getattr(apply_hooks, VERIFIED_ATTR, False):
        return

    def apply_then_check() -> None:
        apply_hooks()
        missing = [target for target, _, hook in HOOKS if not hook_applied(target, hook)]
        if missing:
            message = (
                f"npr isolated merge plugin: the hook on {', '.join(missing)} did not apply (see SGLang's "
                "'Failed to apply hooks' above); refusing to serve isolated requests as stock ones"
            )
            logger.critical(message)
            raise SystemExit(message)
        logger.warning(
            "npr isolated merge plugin ON (EXPERIMENTAL): hooks applied on %s",
            ", ".join(t for t, _, _ in HOOKS),
        )

    setattr(apply_then_check, VERIFIED_ATTR, True)
    registry.apply_hooks = staticmethod(apply_then_check)


def hook_applied(target: str, hook: Any) -> bool:
    """Whether ``target`` (a dotted attribute path) now runs ``hook``: SGLang's wrappers keep the hook in
    their closure and the function they wrap as ``__wrapped__``."""
    owner_path, name = target.rsplit(".", 1)
    try:
        owner = pkgutil.resolve_name(owner_path)
    except (ImportError, AttributeError, ValueError):
        return False
    fn = (owner.__dict__ if isinstance(owner, type) else vars(owner)).get(name)
    fn = getattr(fn, "__func__", fn)  # a classmethod's function
    while fn is not None:
        if any(cell.cell_contents is hook for cell in (getattr(fn, "__closure__", None) or ())):
            return True
        fn = getattr(fn, "__wrapped__", None)
    return False
