"""The ``npr_parallel`` agent loop, driven as verl's agent-loop worker drives it, on the tiny model (no Ray).

verl's ``server_manager`` is replaced by a torch-backed stand-in with its ``generate`` signature and
``TokenOutput`` result: each request is read causally at positions ``0..L-1`` and sampled sequentially,
as an SGLang server does, so branches are exact and the merge is re-prefilled. (A real SGLang server
cannot run on this CPU-only machine: its server needs the CUDA kernels, see stack-ml.md §5.)
"""

from __future__ import annotations

import asyncio
import copy
import math
from dataclasses import replace
from typing import Any

import torch
from verl.experimental.agent_loop.agent_loop import DictConfigWrap
from verl.utils.dataset.rl_dataset import RLHFDataset
from verl.workers.rollout.replica import TokenOutput

from components.config import load_config
from components.data.synthetic import generate_problems
from components.engine.backends.torch_tokens import TorchTokenGenerator
from components.engine.controller import end_of_turn_ids
from components.models.tags import add_tag_tokens
from components.prompts import chat_messages
from components.structure import TagIds, post_merge_mask
from components.training.rl_batch import Rollout, build_policy_batch, response_log_probs, structural_rejection
from components.training.verl.job import VerlRunInputs, build_overrides, reward_settings
from components.training.verl.plugins.agent_loop import NPRParallelAgentLoop, registered_agent_loop
from components.training.verl.validate import compose_verl_config

INPUTS = VerlRunInputs("/models/npr-beta", "/data/train.parquet", "/data/val.parquet", "/runs/papo")


class TorchServerManager:
    """verl's ``server_manager.generate`` (signature and ``TokenOutput``) over the engine's SGLang-shaped
    torch token generator: causal reading at positions ``0..L-1``, per-request ``sampling_seed``."""

    def __init__(self, model: Any, tokenizer: Any) -> None:
        self.tokens = TorchTokenGenerator(model, end_of_turn_ids(tokenizer), deterministic=True)
        self.request_ids: list[str] = []
        self.calls = 0

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict, **_: Any):
        self.request_ids.append(request_id)
        self.calls += 1
        assert sampling_params.get("logprobs"), "the agent loop must ask for log-probs"
        answer = await asyncio.to_thread(self.tokens.generate, list(prompt_ids), dict(sampling_params))
        return TokenOutput(
            token_ids=answer.token_ids, log_probs=answer.log_probs, stop_reason=answer.stop_reason
        )


def agent_loop(model, tok, cfg) -> NPRParallelAgentLoop:
    """The loop as verl's worker makes it (hydra target of the registered name); call it inside the event
    loop that runs it, as the worker does (verl binds the running loop at construction)."""
    config = compose_verl_config(build_overrides("papo_rl", cfg.papo_rl, INPUTS, "npr"))
    cls = registered_agent_loop(config.actor_rollout_ref.rollout.agent.default_agent_loop)
    assert cls is NPRParallelAgentLoop
    return cls(
        trainer_config=DictConfigWrap(config),
        server_manager=TorchServerManager(model, tok),
        tokenizer=tok,
        processor=None,
        dataset_cls=RLHFDataset,
        data_config=DictConfigWrap(config.data),
    )


def dataset_row(problem: dict, cfg, split: str = "train", session: int = 0) -> dict:
    """One sample's kwargs, as verl's dataset and worker hand them to ``run``."""
    return {
        "raw_prompt": chat_messages(problem["problem"], cfg.prompts, "parallel"),
        "data_source": "synthetic",
        "reward_model": {"style": "rule", "ground_truth": str(problem["answer"])},
        # held_out marks verl's validation set, as write_verl_parquet writes it
        "extra_info": {
            "id": problem["id"],
            "split": split,
            "held_out": split != "train",
            **reward_settings(cfg.papo_rl, cfg.grading, cfg.schema_name),
        },
        "uid": problem["id"],
        "session_id": session,
        "global_steps": 1,
        "index": 0,
    }


SAMPLING = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "logprobs": True}


def test_rollouts_fork_and_merge_and_branch_logprobs_match_the_trainer(warm_world):
    model, tok = warm_world
    cfg = load_config(profile="tiny")
    tags = TagIds.from_tokenizer(tok, "npr")
    NPRParallelAgentLoop.filter_counts.clear()
    problems = generate_problems(24, seed=21, weights={"easy": 1.0})  # the warm-up's (shortest) traces

    async def all_rollouts():
        loop = agent_loop(model, tok, cfg)
        outs = await asyncio.gather(*(loop.run(dict(SAMPLING), **dataset_row(p, cfg)) for p in problems))
        return loop, outs

    loop, outputs = asyncio.run(all_rollouts())
    kept = [o for o in outputs if o != []]
    counts = NPRParallelAgentLoop.filter_counts
    assert counts["kept"] == len(kept) and counts["rejected"] == len(outputs) - len(kept)
    assert sum(v for k, v in counts.items() if k.startswith("rejected/")) == counts["rejected"]
    forked = [
        o
        for o in kept
        if any(
            b["merged"] and len(b["branch_tokens"]) >= 2 for b in o.extra_fields["npr_structure"]["blocks"]
        )
    ]
    assert len(forked) >= 3, (
        f"only {len(forked)} of {len(kept)} kept rollouts forked and merged: {dict(counts)}"
    )
    # one request id per sample, shared by all its requests (sticky routing)
    assert len(set(loop.server_manager.request_ids)) == len(problems) < loop.server_manager.calls

    rollouts = [Rollout("g", "p", "0", o.prompt_ids, o.response_ids, "", "stop", True) for o in forked]
    batch = build_policy_batch(rollouts, tok.pad_token_id, tags)
    with torch.no_grad():
        trainer, _ = response_log_probs(model, batch)
    branch_diffs, post_diffs = [], []
    for b, o in enumerate(forked):
        assert o.response_mask == [1] * len(o.response_ids)  # forced tokens train too (local trainer's rule)
        assert isinstance(o.reward_score, float) and "acc" in o.extra_fields["reward_extra_info"]
        after = post_merge_mask(o.prompt_ids + o.response_ids, tags, len(o.prompt_ids))
        for i, lp in enumerate(o.response_logprobs):
            if not math.isfinite(lp):  # a forced token: the server returns no log-prob for prompt tokens
                continue
            (post_diffs if after[i] else branch_diffs).append(abs(lp - float(trainer[b, i])))
    assert branch_diffs and max(branch_diffs) <= 1e-4
    # after a re-prefilled merge the server read the branches sequentially: not the isolated trainer's context
    assert post_diffs and max(post_diffs) > 1e-3
    # ... but exactly the context of the trainer under reread semantics: every token, post-merge included
    reread = build_policy_batch(rollouts, tok.pad_token_id, tags, "reread")
    with torch.no_grad():
        trainer_rr, _ = response_log_probs(model, reread)
    rr_diffs = [
        abs(lp - float(trainer_rr[b, i]))
        for b, o in enumerate(forked)
        for i, lp in enumerate(o.response_logprobs)
        if math.isfinite(lp)
    ]
    assert len(rr_diffs) == len(branch_diffs) + len(post_diffs) and max(rr_diffs) <= 1e-4


def test_a_structurally_invalid_trace_is_dropped_and_counted_but_kept_for_validation(warm_world):
    model, tok = warm_world
    cfg = load_config(profile="tiny")
    problem = generate_problems(1, seed=3)[0]
    NPRParallelAgentLoop.filter_counts.clear()
    prefix = "<guideline><plan>1: a</plan><plan>2: b</plan></guideline>"

    class Prefixed(TorchServerManager):
        """Answers the first main-stream request with a fixed guideline, then samples."""

        async def generate(self, request_id, *, prompt_ids, sampling_params, **kw):
            if self.calls == 0:
                self.calls += 1
                ids = tok.encode(prefix, add_special_tokens=False)
                return TokenOutput(token_ids=ids, log_probs=[-1.0] * len(ids), stop_reason="stop")
            return await super().generate(request_id, prompt_ids=prompt_ids, sampling_params=sampling_params)

    async def one(split: str):
        loop = agent_loop(model, tok, cfg)
        # a budget that ends inside the first block: the guideline fits, its steps cannot close
        loop.response_length = len(tok.encode(prefix, add_special_tokens=False)) + 6
        loop.server_manager = Prefixed(model, tok)
        return await loop.run(dict(SAMPLING), **dataset_row(problem, cfg, split=split))

    assert asyncio.run(one("train")) == []
    assert NPRParallelAgentLoop.filter_counts["rejected"] == 1
    assert sum(v for k, v in NPRParallelAgentLoop.filter_counts.items() if k.startswith("rejected/")) == 1

    held_out = asyncio.run(one("test"))
    assert held_out != [] and held_out.extra_fields["reward_extra_info"]["structurally_rejected"] is True


def test_steps_written_after_a_refused_fork_are_dropped_not_trained_as_branches(warm_world):
    """More plans than ``max_branches``: the controller refuses the fork and the main stream goes on, so the
    model writes the block's steps itself, each reading the ones before it at sequential positions. The actor
    lays every block out as branches (siblings blind to each other, positions restarted): a context those
    tokens were never sampled in. Such a trace is dropped as ``unforked_steps``; validation keeps it."""
    model, tok = warm_world
    cfg = load_config(profile="tiny")
    problem = generate_problems(1, seed=3)[0]
    labels = range(1, 7)  # one more plan than the controller's max_branches (EngineConfig: 5)
    guideline = "<guideline>" + "".join(f"<plan>{i}: add</plan>" for i in labels) + "</guideline>"
    written = "".join(f"<step>{i}: 1+1=2</step>" for i in labels) + "<takeaway>2</takeaway> \\boxed{2}"
    answers = [tok.encode(guideline, add_special_tokens=False)]
    answers.append(tok.encode(written, add_special_tokens=False) + [tok.eos_token_id])

    class Scripted(TorchServerManager):
        """Answers the main stream's requests with the guideline, then (the fork refused) the steps."""

        async def generate(self, request_id, *, prompt_ids, sampling_params, **kw):
            ids = answers[self.calls]
            self.calls += 1
            return TokenOutput(token_ids=ids, log_probs=[-1.0] * len(ids), stop_reason="stop")

    async def one(split: str):
        loop = agent_loop(model, tok, cfg)
        loop.server_manager = Scripted(model, tok)
        out = await loop.run(dict(SAMPLING), **dataset_row(problem, cfg, split=split))
        assert loop.server_manager.calls == 2, "no branch request: the fork was refused"
        return out

    NPRParallelAgentLoop.filter_counts.clear()
    assert asyncio.run(one("train")) == []
    assert dict(NPRParallelAgentLoop.filter_counts) == {"rejected": 1, "rejected/unforked_steps": 1}

    held_out = asyncio.run(one("test"))
    assert held_out != [] and held_out.extra_fields["reward_extra_info"]["structurally_rejected"] is True
    assert held_out.extra_fields["reward_extra_info"]["fork_refusals"] == 1
    # the structure itself is well formed: only where it was sampled makes it untrainable as branches
    prompt, response = held_out.prompt_ids, held_out.response_ids
    assert (
        structural_rejection(
            Rollout("g", "p", "2", prompt, response, "", "stop", False), TagIds.from_tokenizer(tok, "npr")
        )
        is None
    )


def test_parallel_r1_rollouts_fork_at_parallel_into_the_paths_the_row_asks_for(warm_world, monkeypatch):
    """pr1_rl's job: NPR_SCHEMA=parallel_r1, the paths per block and the path cap from the row
    (``extra_info.generation``), the alternating reward at the sample's ``global_steps``."""
    model, tok = warm_world
    tok = copy.deepcopy(tok)  # the session's tokenizer stays NPR-only for the other tests
    add_tag_tokens(model, tok, "parallel_r1")
    monkeypatch.setenv("NPR_SCHEMA", "parallel_r1")
    cfg = load_config(profile="tiny")
    tags = TagIds.from_tokenizer(tok, "parallel_r1")
    opener = tok.encode("<Parallel>", add_special_tokens=False)
    problems = generate_problems(8, seed=5)

    class Opening(TorchServerManager):
        """Answers each sample's first request with <Parallel> (a fresh model rarely writes it), then samples."""

        seen: set[str] = set()

        async def generate(self, request_id, *, prompt_ids, sampling_params, **kw):
            if request_id not in self.seen:
                self.seen.add(request_id)
                self.request_ids.append(request_id)
                return TokenOutput(token_ids=opener, log_probs=[-1.0], stop_reason="stop")
            return await super().generate(request_id, prompt_ids=prompt_ids, sampling_params=sampling_params)

    def row(problem: dict) -> dict:
        settings = reward_settings(cfg.pr1_rl, cfg.grading, "parallel_r1")
        return {
            **dataset_row(problem, cfg),
            "raw_prompt": chat_messages(problem["problem"], cfg.prompts, "parallel_r1"),
            "extra_info": {
                "id": problem["id"],
                "split": "test",
                "held_out": True,
                **settings,
                "generation": {"paths": 3, "max_step_tokens": 6},
            },
            "global_steps": 9,
        }

    async def all_rollouts():
        config = compose_verl_config(build_overrides("pr1_rl", cfg.pr1_rl, INPUTS, "npr"))
        assert config.actor_rollout_ref.rollout.agent.default_agent_loop == "npr_parallel"
        loop = registered_agent_loop("npr_parallel")(
            trainer_config=DictConfigWrap(config),
            server_manager=Opening(model, tok),
            tokenizer=tok,
            processor=None,
            dataset_cls=RLHFDataset,
            data_config=DictConfigWrap(config.data),
        )
        return await asyncio.gather(*(loop.run(dict(SAMPLING), **row(p)) for p in problems))

    outputs = asyncio.run(all_rollouts())  # validation rows: none is dropped
    assert len(outputs) == len(problems)
    merged = [o for o in outputs if o.extra_fields["npr_structure"]["blocks"][0]["merged"]]
    assert len(merged) >= 3
    after = [tags.ids["</Parallel>"], tags.ids["<Summary>"]]
    for o in outputs:
        block = o.extra_fields["npr_structure"]["blocks"][0]
        assert len(block["branch_tokens"]) == 3  # the row's paths, not the schema's 2
        assert o.reward_score in (1.2, 1.0, -1.0)  # step 9 rewards parallel answers
    for o in merged:
        end = 1 + sum(o.extra_fields["npr_structure"]["blocks"][0]["branch_tokens"])
        assert o.response_ids[end : end + 2] == after  # forced into the main stream after the paths
    # the trainer's log-probs of the paths: each trace cut after the forced merge and its summary closed
    # (what the model wrote after it does not change the paths' context)
    cut = []
    for o in merged:
        end = 1 + sum(o.extra_fields["npr_structure"]["blocks"][0]["branch_tokens"])
        response = o.response_ids[: end + 2] + [tags.ids["</Summary>"]]
        cut.append((Rollout("g", "p", "0", o.prompt_ids, response, "", "stop", True), o, end))
    for r, o, _ in cut:  # the structural filter finds the engine's forks where Parallel-R1's paths are
        forked_at = tuple(b["start"] for b in o.extra_fields["npr_structure"]["blocks"])
        assert structural_rejection(replace(r, forked_at=forked_at), tags) is None
        assert structural_rejection(replace(r, forked_at=()), tags) == "unforked_steps"
    batch = build_policy_batch([r for r, _, _ in cut], tok.pad_token_id, tags)
    with torch.no_grad():
        trainer, _ = response_log_probs(model, batch)
    diffs = [
        abs(lp - float(trainer[b, i]))
        for b, (_, o, end) in enumerate(cut)
        for i, lp in enumerate(o.response_logprobs[:end])
        if math.isfinite(lp) and i > 0
    ]
    assert diffs and max(diffs) <= 1e-4  # paths: exactly the trainer's parallel log-probs
