"""The NPR actor (verl's FSDP engine subclass) on the tiny model, driven through verl's own batch path.

The engine instance is made without ``FSDPEngine.__init__`` (it builds a CUDA device mesh); everything
else is verl's: ``forward_backward_batch`` (micro-batching, token counts), ``prepare_model_inputs`` /
``prepare_model_outputs`` (padding, temperature, log-probs, entropy), ``ppo_loss`` with ``loss_mode=papo``
and the ``no_padding_2_padding`` response slicing. A single-process gloo group stands in for the data-
parallel world.
"""

from __future__ import annotations

import random
from functools import partial
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
from tensordict import TensorDict
from verl.trainer.config.algorithm import RolloutCorrectionConfig
from verl.utils import tensordict_utils as tu
from verl.utils.dataset.dataset_utils import DatasetPadMode
from verl.workers.config import ActorConfig
from verl.workers.config.actor import PolicyLossConfig
from verl.workers.engine.fsdp import transformer_impl
from verl.workers.utils.losses import ppo_loss
from verl.workers.utils.padding import no_padding_2_padding

from components.config import load_config
from components.data.synthetic import expression_of, generate_problems, render_parallel
from components.models.tiny import tiny_test_world
from components.prompts import render_prompt
from components.structure import TagIds, post_merge_mask
from components.training.rl_batch import Rollout, build_policy_batch, response_log_probs
from components.training.rl_objective import compute_policy_loss
from components.training.verl.plugins.engine import NPRParallelEngine
from tests.support.builders import rendered_rollouts as make_rollouts


@pytest.fixture(scope="module")
def gloo_world(tmp_path_factory):
    """A one-process default group, as FSDP's data-parallel world of size 1."""
    if dist.is_initialized():
        yield
        return
    init = tmp_path_factory.mktemp("pg") / "store"
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def world():
    torch.manual_seed(0)
    model, tok = tiny_test_world(seed=0)
    return model, tok, TagIds.from_tokenizer(tok, "npr"), load_config(profile="tiny")


def npr_engine(model, tok, monkeypatch) -> NPRParallelEngine:
    """The registered engine class, with the attributes its hooks read set by hand (no CUDA mesh)."""
    monkeypatch.setattr(transformer_impl, "get_device_id", lambda: "cpu")
    monkeypatch.setattr(transformer_impl, "get_device_name", lambda: "cpu")
    engine = object.__new__(NPRParallelEngine)
    engine.module = model
    engine.model_config = SimpleNamespace(tokenizer=tok, hf_config=model.config)
    engine.engine_config = SimpleNamespace(
        entropy_checkpointing=False, use_no_sync_for_gradient_accumulation=True
    )
    engine.pad_to_length = False
    engine.use_ulysses_sp = False
    engine.ulysses_sequence_parallel_size = 1
    engine.ulysses_device_mesh = None
    engine._autocast_dtype = torch.float32  # CPU: verl skips autocast for fp32
    engine.scaler = None
    return engine


def verl_batch(rollouts, advantages, rollout_log_probs, micro_batch_size: int):
    """The actor's input as verl's TransferQueue path stores it: one nested row per sample."""
    rows = []
    for r, adv, lp in zip(rollouts, advantages, rollout_log_probs, strict=True):
        prompts, responses = torch.tensor(r.prompt_ids), torch.tensor(r.response_ids)
        input_ids = torch.cat([prompts, responses])
        n = len(r.response_ids)
        rows.append(
            {
                "prompts": prompts,
                "responses": responses,
                "input_ids": input_ids,
                "position_ids": torch.arange(input_ids.numel()),  # verl's arange; the engine replaces it
                "response_mask": torch.ones(n, dtype=torch.int64),
                "loss_mask": torch.ones(n, dtype=torch.int64),
                "old_log_probs": lp[:n].clone(),
                "advantages": adv[:n].clone(),
            }
        )
    # jagged per-sample fields, as TransferQueue returns them (list_of_dict_to_tensordict would stack
    # fields that happen to have equal lengths)
    data = TensorDict(
        {
            key: torch.nested.as_nested_tensor([row[key] for row in rows], layout=torch.jagged)
            for key in rows[0]
        },
        batch_size=[len(rows)],
    )
    tu.assign_non_tensor(
        data,
        use_remove_padding=False,
        pad_mode=DatasetPadMode.NO_PADDING,
        use_dynamic_bsz=False,
        micro_batch_size_per_gpu=micro_batch_size,
        use_fused_kernels=False,
        temperature=1.0,
        calculate_entropy=True,
        pad_token_id=0,
        global_batch_size=len(rollouts),
    )
    return data


def papo_actor_config(threshold: float | None = None) -> ActorConfig:
    correction = RolloutCorrectionConfig(
        rollout_is="token" if threshold else None, rollout_is_threshold=threshold or 2.0
    )
    policy_loss = PolicyLossConfig(loss_mode="papo", rollout_correction=correction)
    return ActorConfig(
        strategy="fsdp2",
        rollout_n=2,
        ppo_micro_batch_size_per_gpu=2,
        loss_agg_mode="token-mean",
        policy_loss=policy_loss,
    )


def engine_log_probs(engine, rollouts, micro_batch_size=2) -> torch.Tensor:
    zeros = [torch.zeros(len(r.response_ids)) for r in rollouts]
    data = verl_batch(rollouts, zeros, zeros, micro_batch_size)
    out = engine.infer_batch(data)
    return no_padding_2_padding(out["model_output"]["log_probs"], data)


@pytest.mark.parametrize("parallel", [True, False], ids=["parallel", "sequential"])
def test_engine_log_probs_equal_the_local_trainer(world, gloo_world, monkeypatch, parallel):
    model, tok, tags, cfg = world
    rollouts = make_rollouts(tok, cfg, 6, parallel=parallel, seed=3 if parallel else 4)
    assert len({len(r.prompt_ids) + len(r.response_ids) for r in rollouts}) > 1, "ragged lengths"
    engine = npr_engine(model, tok, monkeypatch)
    got = engine_log_probs(engine, rollouts)
    batch = build_policy_batch(rollouts, tok.pad_token_id, tags if parallel else None)
    with torch.no_grad():
        want, _ = response_log_probs(model, batch)
    assert got.shape == want.shape
    assert (got - want).abs().max().item() <= 1e-5
    if parallel:
        # the stock engine's causal forward disagrees: this is what the subclass exists for
        stock = object.__new__(transformer_impl.FSDPEngineWithLMHead)
        stock.__dict__.update(engine.__dict__)
        causal = engine_log_probs(stock, rollouts)
        assert (causal - want).abs().max().item() > 1e-2  # 1e3 x the tolerance above, on random weights


def test_under_reread_the_engine_lays_out_the_re_read_and_equals_the_local_trainer(
    world, gloo_world, monkeypatch
):
    """``NPR_MERGE_SEMANTICS=reread`` (the launcher sets it from ``merge_semantics``): the actor's forward
    runs on the laid-out rows (re-read copies of branches 2..k) and hands verl logits in verl's own layout;
    its log-probs equal the local trainer's under reread, and differ from isolated after the merge."""
    from components.structure import Role
    from components.training.verl.plugin_names import MERGE_ENV

    model, tok, tags, cfg = world
    rollouts = make_rollouts(tok, cfg, 6, parallel=True, seed=3)
    engine = npr_engine(model, tok, monkeypatch)
    monkeypatch.setenv(MERGE_ENV, "reread")
    got = engine_log_probs(engine, rollouts)
    with torch.no_grad():
        want, _ = response_log_probs(model, build_policy_batch(rollouts, tok.pad_token_id, tags, "reread"))
        iso, _ = response_log_probs(model, build_policy_batch(rollouts, tok.pad_token_id, tags, "isolated"))
    assert got.shape == want.shape
    assert (got - want).abs().max().item() <= 1e-5
    post = torch.zeros_like(got, dtype=torch.bool)
    for b, r in enumerate(rollouts):
        row = torch.from_numpy(post_merge_mask(r.prompt_ids + r.response_ids, tags, len(r.prompt_ids)))
        post[b, : row.numel()] = row
    assert post.any() and tags.id_for(Role.SUMMARY_OPEN) in rollouts[0].response_ids
    assert (got - iso).abs()[~post].max().item() <= 1e-5  # before the first merge both semantics agree
    assert (got - iso).abs()[post].max().item() > 1e-3
    monkeypatch.setenv(MERGE_ENV, "sequential")
    with pytest.raises(ValueError, match="unknown merge semantics"):
        engine_log_probs(engine, rollouts)


def test_ppo_loss_with_papo_backpropagates_through_the_engine(world, gloo_world, monkeypatch):
    model, tok, tags, cfg = world
    rollouts = make_rollouts(tok, cfg, 4, parallel=True, seed=5)
    engine = npr_engine(model, tok, monkeypatch)
    gen = torch.Generator().manual_seed(0)
    advantages = [torch.full((len(r.response_ids),), float(torch.randn(1, generator=gen))) for r in rollouts]
    with torch.no_grad():
        rollout_lp = list(engine_log_probs(engine, rollouts, micro_batch_size=4))

    # verl: two micro-batches of two, ppo_loss(loss_mode=papo) on the engine's log-probs
    model.zero_grad(set_to_none=True)
    data = verl_batch(rollouts, advantages, rollout_lp, micro_batch_size=2)
    out = engine.forward_backward_batch(
        data, partial(ppo_loss, config=papo_actor_config()), forward_only=False
    )
    assert "actor/pg_loss" in out["metrics"]
    verl_grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    assert verl_grads and all(torch.isfinite(g).all() for g in verl_grads.values())

    # local trainer: one batch, the same registered loss on rl_batch's log-probs
    model.zero_grad(set_to_none=True)
    batch = build_policy_batch(rollouts, tok.pad_token_id, tags)
    log_prob, _ = response_log_probs(model, batch)
    adv = torch.nn.utils.rnn.pad_sequence(advantages, batch_first=True)
    loss, _ = compute_policy_loss(
        "papo", log_prob.detach(), log_prob, adv, batch.response_mask, papo_actor_config()
    )
    loss.backward()
    for name, grad in verl_grads.items():
        torch.testing.assert_close(grad, model.get_parameter(name).grad, atol=1e-6, rtol=1e-4)


def _merged_rollout(tok, cfg) -> Rollout:
    """A two-block parallel trace: the second block's tokens come after a multi-branch merge."""
    rng = random.Random(9)
    problem = generate_problems(1, seed=9)[0]
    expr = expression_of(problem)
    text = render_parallel(expr, rng) + " " + render_parallel(expr, rng)
    prompt = render_prompt(tok, problem["problem"], cfg.prompts, "parallel")
    return Rollout(
        "g",
        problem["id"],
        problem["answer"],
        tok.encode(prompt, add_special_tokens=False),
        tok.encode(text, add_special_tokens=False) + [tok.eos_token_id],
        text,
        "stop",
        True,
    )


def test_post_merge_tokens_get_the_truncated_weight(world, gloo_world, monkeypatch):
    """Rollout log-probs that differ after the merge (as a re-prefilled merge makes them) are reweighted
    there, min(exp(lp - lp_rollout), C), and reported apart from the exact pre-merge tokens."""
    model, tok, tags, cfg = world
    rollouts = [_merged_rollout(tok, cfg), *make_rollouts(tok, cfg, 1, parallel=True, seed=6)]
    engine = npr_engine(model, tok, monkeypatch)
    with torch.no_grad():
        exact = engine_log_probs(engine, rollouts, micro_batch_size=2)
    merged = [
        torch.from_numpy(post_merge_mask(r.prompt_ids + r.response_ids, tags, len(r.prompt_ids)))
        for r in rollouts
    ]
    assert merged[0].any() and not merged[0][0] and merged[0][-1]
    # the rollout engine saw a different context after the merge: its log-probs there are lower by 2 nats
    rollout_lp = [exact[b, : len(r.response_ids)] - 2.0 * merged[b].float() for b, r in enumerate(rollouts)]
    advantages = [torch.ones(len(r.response_ids)) for r in rollouts]

    captured = {}

    def spy(model_output, data, dp_group=None, config=None):
        captured["weights"] = data["rollout_is_weights"].to_padded_tensor(-1.0)
        return ppo_loss(config, model_output, data, dp_group)

    config = papo_actor_config(threshold=3.0)
    data = verl_batch(rollouts, advantages, rollout_lp, micro_batch_size=2)
    out = engine.forward_backward_batch(data, partial(spy, config=config), forward_only=False)
    weights = captured["weights"]
    for b, r in enumerate(rollouts):
        n = len(r.response_ids)
        w = weights[b, :n]
        expected = torch.where(merged[b], torch.full((n,), 3.0), torch.ones(n))  # exp(2) = 7.39 -> C = 3
        torch.testing.assert_close(w, expected, atol=1e-5, rtol=0)
    metrics = {k: v for k, v in out["metrics"].items() if k.startswith("rollout_corr/")}
    first = {k: v.values[0] for k, v in metrics.items()}  # the first micro-batch: the two-block trace
    assert first["rollout_corr/pre_merge_abs_logp_diff_max"] <= 1e-5
    assert first["rollout_corr/post_merge_abs_logp_diff_mean"] == pytest.approx(2.0, abs=1e-4)
    assert first["rollout_corr/post_merge_is_truncated_frac"] == pytest.approx(1.0)
