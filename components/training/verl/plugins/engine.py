"""The NPR actor: verl's FSDP language-model engine with the canonical parallel forward.

``NPRParallelEngine`` subclasses ``FSDPEngineWithLMHead`` and is registered in verl's ``EngineRegistry``
under the vendor key ``npr`` (``names.ENGINE_VENDOR``); with ``VERL_ENGINE_VENDOR=npr`` (set by the launcher
for ``papo_rl`` only) every actor the trainer builds is this class. Sharding, offload, optimizer,
checkpoints and the loss call are verl's; three hooks change:

- ``prepare_model_inputs``: the stock padded (no remove-padding) inputs, with the 2D padding mask and
  ``arange`` positions replaced by the canonical parallel mask (bool ``[B, 1, L, L]``, sibling steps blind to
  each other) and positions of ``components.structure`` (``batch_parallel_attention_inputs``, the builder
  ``components.training.rl_batch`` uses). A response without blocks gets the causal mask and ``arange``.
- ``prepare_model_outputs``: each token is scored from the logits of its prediction source
  (``components.structure.prediction_sources``: the first token of a step from ``</guideline>``, where the
  engine forked it) instead of the previous index; the few rows that differ are moved in place before
  verl computes log-probs and entropy, so verl's log-probs are exactly ``rl_batch.response_log_probs``.
- ``forward_step``: before verl's loss runs, tokens sampled after a re-prefilled merge get the truncated
  importance weight of ``components.training.papo.post_merge_is_weights`` as verl's ``rollout_is_weights``
  (C = ``actor.policy_loss.rollout_correction.rollout_is_threshold`` with ``rollout_is: token``), and the
  rollout/trainer mismatch of pre- and post-merge tokens is added to the loss metrics.

Requirements the launcher sets and ``validate_job`` checks: ``use_remove_padding: false`` (packing drops
the attention mask), ulysses 1, no fused kernels, attention ``sdpa`` or ``flex_attention`` (``eager`` gets
the additive form of the mask). ``FSDPEngine.__init__`` needs CUDA; the hooks run on any device (tests
drive them on CPU on an instance created without ``__init__``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

import torch
from verl.utils import tensordict_utils as tu
from verl.utils.metric import AggregationType, Metric
from verl.workers.engine.base import EngineRegistry
from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead
from verl.workers.utils.padding import no_padding_2_padding

from components.structure import (
    StructureError,
    TagIds,
    check_semantics,
    lay_out,
    post_merge_mask,
    prediction_sources,
    to_additive_mask,
)
from components.training.papo import post_merge_is_weights
from components.training.verl.plugin_names import (
    DEFAULT_MERGE,
    DEFAULT_SCHEMA,
    ENGINE_DEVICES,
    ENGINE_VENDOR,
    MERGE_ENV,
    SCHEMA_ENV,
)

_SOURCES_KEY = "npr_prediction_sources"
_LENGTHS_KEY = "npr_sequence_lengths"
_ROUTE_KEY = "npr_logit_rows"


def prompt_lengths(data: Any) -> list[int]:
    """Prompt length of every sample of a micro-batch: nested ``prompts`` (TransferQueue path) or, for the
    padded legacy layout, the ones of ``attention_mask`` over the prompt columns (as verl's own
    ``no_padding_2_padding`` reads them)."""
    prompts = data["prompts"]
    if prompts.is_nested:
        return [int(n) for n in prompts.offsets().diff().tolist()]
    width = prompts.shape[1]
    if "attention_mask" not in data:  # equal-length prompts stacked densely, no padding
        return [int(width)] * int(prompts.shape[0])
    return [int(n) for n in data["attention_mask"][:, :width].sum(dim=1).tolist()]


def _sequences(data: Any) -> list[list[int]]:
    input_ids = data["input_ids"]
    if not input_ids.is_nested:
        raise ValueError("the NPR actor expects verl's no-padding layout (nested input_ids)")
    return [row.tolist() for row in input_ids.unbind()]


def _response_padded(tensor: torch.Tensor, width: int, fill: float) -> torch.Tensor:
    """A response-aligned tensor (nested or padded) as a dense ``(bs, width)`` tensor."""
    dense = tensor.to_padded_tensor(fill) if tensor.is_nested else tensor
    if dense.shape[1] < width:
        dense = torch.nn.functional.pad(dense, (0, width - dense.shape[1]), value=fill)
    return dense[:, :width]


def _like_response(values: torch.Tensor, template: torch.Tensor) -> torch.Tensor:
    """``values`` ``(bs, R)`` in the layout of ``template`` (nested jagged as verl stores response fields)."""
    if not template.is_nested:
        return values[:, : template.shape[1]]
    lengths = template.offsets().diff().tolist()
    return torch.nested.as_nested_tensor([values[b, :n] for b, n in enumerate(lengths)], layout=torch.jagged)


def _field(node: Any, key: str) -> Any:
    if node is None:
        return None
    if isinstance(node, Mapping):
        return node.get(key)
    return getattr(node, key, None)


def tis_threshold(loss_function: Callable[..., Any]) -> float | None:
    """C of the post-merge correction from the actor config verl binds into its loss (``partial(ppo_loss,
    config=ActorConfig)``): ``policy_loss.rollout_correction`` with ``rollout_is: token`` -> its
    ``rollout_is_threshold``; None when token-level IS is off."""
    config = getattr(loss_function, "keywords", {}).get("config")
    policy_loss = getattr(config, "policy_loss", None)
    correction = _field(policy_loss, "rollout_correction")
    # verl keeps a rollout_correction added by override as a plain dict, a dataclass otherwise
    if correction is None or _field(correction, "rollout_is") != "token":
        return None
    threshold = _field(correction, "rollout_is_threshold")
    try:
        return float(threshold)
    except (TypeError, ValueError):
        raise ValueError(
            "the NPR actor's post-merge correction truncates at one upper bound C; "
            f"actor.policy_loss.rollout_correction.rollout_is_threshold={threshold!r} is not a number"
        ) from None


@EngineRegistry.register(
    model_type="language_model", backend=["fsdp", "fsdp2"], device=list(ENGINE_DEVICES), vendor=ENGINE_VENDOR
)
class NPRParallelEngine(FSDPEngineWithLMHead):
    """verl's FSDP actor whose log-probs are the canonical parallel ones (see the module docstring)."""

    def npr_tags(self) -> TagIds:
        """Tag ids of the schema (``NPR_SCHEMA``, default npr) in the model's tokenizer, looked up once."""
        tags = getattr(self, "_npr_tags", None)
        if tags is None:
            tokenizer = getattr(self.model_config, "tokenizer", None)
            if tokenizer is None:
                raise ValueError("the NPR actor needs the model's tokenizer (model.load_tokenizer: true)")
            tags = TagIds.from_tokenizer(tokenizer, os.environ.get(SCHEMA_ENV, DEFAULT_SCHEMA))
            self._npr_tags = tags
        return tags

    # ------------------------------------------------------------------------------------------ inputs
    def prepare_model_inputs(self, micro_batch: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        if tu.get_non_tensor_data(data=micro_batch, key="use_remove_padding", default=True):
            raise ValueError(
                "the NPR actor needs actor_rollout_ref.model.use_remove_padding=false: verl's packed "
                "forward drops the attention mask, and with it the parallel mask"
            )
        if tu.get_non_tensor_data(data=micro_batch, key="use_fused_kernels", default=False):
            raise ValueError(
                "the NPR actor needs use_fused_kernels=false: it re-routes logits before log-probs"
            )
        model_inputs, output_args = super().prepare_model_inputs(micro_batch)
        if model_inputs["position_ids"].dim() != 2:
            raise ValueError("the NPR actor supports text models with 1-D positions only")
        seqs = _sequences(micro_batch)
        starts = prompt_lengths(micro_batch)
        length = int(model_inputs["input_ids"].shape[1])
        merge = check_semantics(os.environ.get(MERGE_ENV, DEFAULT_MERGE))
        try:
            laid = lay_out(seqs, self.npr_tags(), starts=starts, merge=merge, min_length=length)
        except StructureError as err:
            raise StructureError(
                f"a training response has no canonical parallel mask ({err}); the agent loop "
                "(npr_parallel) drops such rollouts, so this one did not come through it"
            ) from err
        device = model_inputs["input_ids"].device
        mask = laid.segments.dense_mask().to(device)
        sources = prediction_sources(mask)
        lengths = torch.tensor([len(s) for s in seqs], device=device)
        if laid.input_ids.shape[1] == length and merge == "isolated":
            output_args[_SOURCES_KEY] = sources
            output_args[_LENGTHS_KEY] = lengths
        else:
            # reread: the rows hold re-read copies; the forward runs on the laid-out ids and its logits come
            # back to verl's layout (row t = the laid-out row that predicts token t + 1)
            model_inputs["input_ids"] = laid.input_ids.to(device)
            output_args[_ROUTE_KEY] = _logit_rows(sources, laid.index.to(device), lengths, length)
        attn = getattr(getattr(self.model_config, "hf_config", None), "_attn_implementation", "sdpa")
        if attn == "eager":
            # eager adds the mask to the scores: a bool mask would be silently wrong (stack-ml.md §2)
            dtype = getattr(self, "_autocast_dtype", torch.float32)
            model_inputs["attention_mask"] = to_additive_mask(mask, dtype)
        else:
            model_inputs["attention_mask"] = mask
        model_inputs["position_ids"] = laid.position_ids.to(device)
        return model_inputs, output_args

    # ------------------------------------------------------------------------------------------ outputs
    def prepare_model_outputs(
        self, output: Any, output_args: dict[str, Any], micro_batch: Any, logits_processor_func
    ):
        sources = output_args.pop(_SOURCES_KEY, None)
        lengths = output_args.pop(_LENGTHS_KEY, None)
        route = output_args.pop(_ROUTE_KEY, None)
        if sources is not None:
            _route_logits_to_prediction_sources(output.logits, sources, lengths)
        if route is not None:
            logits = output.logits
            output.logits = logits.gather(1, route[:, :, None].expand(-1, -1, logits.shape[-1]))
        return super().prepare_model_outputs(output, output_args, micro_batch, logits_processor_func)

    # ------------------------------------------------------------------------------------------ loss
    def forward_step(self, micro_batch: Any, loss_function: Callable[..., Any] | None, forward_only: bool):
        if loss_function is not None:
            loss_function = self._with_post_merge_correction(loss_function)
        return super().forward_step(micro_batch, loss_function=loss_function, forward_only=forward_only)

    def _with_post_merge_correction(self, loss_function: Callable[..., Any]) -> Callable[..., Any]:
        threshold = tis_threshold(loss_function)
        tags = self.npr_tags()

        def corrected(model_output: dict[str, Any], data: Any, dp_group: Any = None):
            metrics: dict[str, float] = {}
            if "old_log_probs" in data and "log_probs" in model_output:
                # bypass mode: old_log_probs *are* the rollout log-probs; prefer the explicit field if present
                rollout_key = "rollout_log_probs" if "rollout_log_probs" in data else "old_log_probs"
                log_prob = no_padding_2_padding(model_output["log_probs"], data).detach()
                width = log_prob.shape[1]
                response_mask = _response_padded(data["response_mask"], width, 0).to(log_prob.device)
                rollout = _response_padded(data[rollout_key], width, 0.0).to(log_prob.device)
                merged = torch.zeros_like(response_mask, dtype=torch.bool)
                for b, (ids, start) in enumerate(zip(_sequences(data), prompt_lengths(data), strict=True)):
                    row = torch.from_numpy(post_merge_mask(ids, tags, start)[:width])
                    merged[b, : row.numel()] = row.to(merged.device)
                weights, metrics = post_merge_is_weights(
                    log_prob, rollout, response_mask, merged, threshold if threshold is not None else 1.0
                )
                if threshold is not None:
                    if "rollout_is_weights" in data:
                        weights = weights * _response_padded(data["rollout_is_weights"], width, 1.0).to(
                            weights
                        )
                    data["rollout_is_weights"] = _like_response(weights, data["response_mask"])
                metrics = _shares_of_the_mini_batch(metrics, int(merged.sum()), data)
            loss, loss_metrics = loss_function(model_output=model_output, data=data, dp_group=dp_group)
            loss_metrics.update({key: Metric(_aggregation_of(key), value) for key, value in metrics.items()})
            return loss, loss_metrics

        return corrected


# The stock actor on the CPU platform (plugins.cpu_platform): verl registers it for cuda and npu only; the
# class is unchanged, only looked up under the ``cpu`` device key too.
EngineRegistry.register(model_type="language_model", backend=["fsdp", "fsdp2"], device="cpu")(FSDPEngineWithLMHead)


# The correction metrics each micro-batch states as its share of the mini-batch's value (summed by verl).
_SHARES = ("rollout_corr/nonfinite_rollout_logp", "rollout_corr/post_merge_token_frac")


def _shares_of_the_mini_batch(metrics: dict[str, float], merged_tokens: int, data: Any) -> dict[str, float]:
    """The non-finite count and the post-merge token fraction as this micro-batch's share of the mini-batch's
    value over every data-parallel rank, so that verl's reduction reports the same number whatever the world
    size.

    verl reduces a loss metric by summing (or averaging) a rank's micro-batches and then *averaging* the
    ranks (``Metric.aggregate_dp``): a count summed per rank came out divided by the world size (2 ranks
    reported 10 non-finite rollout log-probs where 1 rank reported 20, on the same batch), and a fraction
    came out as a mean of micro-batch fractions, which depends on how the batch was split. A count times
    ``dp_size`` and a fraction over ``batch_num_tokens`` (the mini-batch's response tokens on every rank,
    what verl's loss is normalised by) times ``dp_size``, summed, are exact. The per-token means of pre- and
    post-merge tokens have no global denominator here and stay means of micro-batch means, as verl's own
    ``ppo_kl`` is."""
    dp_size = int(_batch_info(data, "dp_size") or 1)
    batch_tokens = _batch_info(data, "batch_num_tokens")
    out = dict(metrics)
    out["rollout_corr/nonfinite_rollout_logp"] = metrics["rollout_corr/nonfinite_rollout_logp"] * dp_size
    if batch_tokens:
        out["rollout_corr/post_merge_token_frac"] = merged_tokens * dp_size / float(batch_tokens)
    else:
        # no global token count on the micro-batch: summed micro-batch fractions would not be the batch's
        # fraction, so it is not reported rather than reported wrong (verl 0.9.1's actor always sets it)
        del out["rollout_corr/post_merge_token_frac"]
    return out


def _batch_info(data: Any, key: str) -> Any:
    """A global-batch field verl's worker puts on every micro-batch (``dp_size``, ``batch_num_tokens``), or None."""
    try:
        return data[key]
    except KeyError:
        return None


def _aggregation_of(key: str) -> AggregationType:
    """How verl reduces a correction metric over micro-batches (then it averages data-parallel ranks)."""
    if key.endswith(("_max", "_p99")):
        return AggregationType.MAX
    if key in _SHARES:
        return AggregationType.SUM
    return AggregationType.MEAN


def _logit_rows(sources: torch.Tensor, index: torch.Tensor, lengths: torch.Tensor, width: int) -> torch.Tensor:
    """long[B, width]: for verl's row ``t`` (the prediction of token ``t + 1``), the laid-out row whose logits
    predict that token (``sources`` long[B, L'] of the laid-out mask, ``index`` long[B, L] where each
    original token sits); rows past a sequence's end keep a harmless in-range row."""
    batch = sources.shape[0]
    rows = torch.arange(width, device=sources.device).expand(batch, -1).clone()
    nxt = (rows + 1).clamp(max=index.shape[1] - 1)
    want = sources.gather(1, index.gather(1, nxt))
    inside = rows < (lengths[:, None] - 1)
    return torch.where(inside, want, rows.clamp(max=sources.shape[1] - 1))


def _route_logits_to_prediction_sources(
    logits: torch.Tensor, sources: torch.Tensor, lengths: torch.Tensor | None
) -> None:
    """In place: row ``t`` of ``logits`` (which verl reads as the prediction of token ``t + 1``) becomes the
    row of token ``t + 1``'s prediction source.

    Only the first token of each sibling step and the merge tag differ from the causal ``t``; their source
    rows are gathered first (a copy of a few rows) and then written, so no row is read after it was
    overwritten. The rows written were used for nothing else: row ``t`` only ever predicts token ``t + 1``.
    """
    batch, length = logits.shape[0], logits.shape[1]
    want = sources[:, 1:].to(logits.device)
    rows = torch.arange(length - 1, device=logits.device).expand(batch, -1)
    inside = rows < ((lengths.to(logits.device) - 1)[:, None] if lengths is not None else length - 1)
    moved = inside & (want != rows)
    if not bool(moved.any()):
        return
    b_idx, t_idx = moved.nonzero(as_tuple=True)
    source_rows = logits[b_idx, want[b_idx, t_idx]]
    logits[b_idx, t_idx] = source_rows


__all__ = ["NPRParallelEngine", "prompt_lengths", "tis_threshold"]
