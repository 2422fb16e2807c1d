"""Device and precision of a training step, caught without a GPU.

- bf16 training keeps fp32 master weights and AdamW state: an lr-1e-7 update moves the weights as an fp32
  run moves them (plain bf16 AdamW loses almost all of it), and a resumed bf16 run is byte-identical;
- every tensor of an RL update and an SFT step lives on the model's device: the steps run with the model
  on the ``meta`` device, where any CPU tensor meeting a model tensor raises (the failure a CUDA run hits).
"""

from __future__ import annotations

import random
from collections import Counter

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from components.config import load_config
from components.data import synthetic
from components.data.synthetic import generate_problems
from components.models.tiny import tiny_test_world
from components.structure import TagIds
from components.training.job import rl_job
from components.training.precision import MasterWeightAdamW, PrecisionError, build_adamw, compute_autocast
from components.training.rl import RLTrainer
from components.training.rl_batch import Rollout
from components.training.sft import SFTSettings, _train_step, build_optimizer, build_scheduler, train_sft
from components.training.sft_data import encode_example
from tests.support.builders import random_rollout_groups, sequential_sft_examples

torch.set_num_threads(1)
DEVICES = ["cpu", "meta"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(scope="module")
def world():
    return tiny_test_world(seed=0)


def _copy(model, dtype=torch.float32, device="cpu"):
    clone = type(model)(model.config)
    clone.load_state_dict(model.state_dict())
    return clone.to(device=device, dtype=dtype)


class FakeScalars(TorchDispatchMode):
    """Meta tensors have no values: answer every ``.item()`` on one with 1 (True), and let boolean
    indexing assume every element is selected, so a whole step runs on the meta device."""

    def __enter__(self):
        import torch.fx.experimental._config as fx_config

        self._nonzero = fx_config.meta_nonzero_assume_all_nonzero
        fx_config.meta_nonzero_assume_all_nonzero = True
        return super().__enter__()

    def __exit__(self, *exc):
        import torch.fx.experimental._config as fx_config

        fx_config.meta_nonzero_assume_all_nonzero = self._nonzero
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default and args[0].device.type == "meta":
            return True if args[0].dtype == torch.bool else (1.0 if args[0].dtype.is_floating_point else 1)
        return func(*args, **(kwargs or {}))


# ------------------------------------------------------------------------------------ master weights
def test_master_weights_keep_the_small_updates_bf16_adamw_rounds_away():
    gen = torch.Generator().manual_seed(0)
    init = (torch.randn(4096, generator=gen) * 0.02).to(torch.bfloat16)
    grads = [torch.randn(4096, generator=gen).to(torch.bfloat16) for _ in range(10)]

    def run(kind: str) -> tuple[torch.Tensor, torch.Tensor]:
        dtype = torch.float32 if kind == "fp32" else torch.bfloat16
        p = torch.nn.Parameter(init.to(dtype).clone())
        opt_cls = MasterWeightAdamW if kind == "master" else torch.optim.AdamW
        opt = opt_cls([{"params": [p]}], lr=1e-7, betas=(0.9, 0.999), weight_decay=0.1)
        for g in grads:
            (p * g.to(dtype)).sum().backward()  # d/dp = g, exactly (g is bf16-representable)
            opt.step()
            opt.zero_grad(set_to_none=True)
        master = opt.master_params[0] if kind == "master" else p.detach().float()
        return p.detach(), master

    _, fp32 = run("fp32")
    bf16_weights, _ = run("bf16")
    master_model, master = run("master")
    moved = lambda w: float((w.float() != init.float()).float().mean())  # noqa: E731
    assert moved(fp32) > 0.99
    assert moved(bf16_weights) < 0.01  # today's failure: bf16 AdamW loses the updates
    assert torch.equal(master, fp32)  # the masters are the fp32 run, bit for bit
    assert torch.equal(master_model, fp32.to(torch.bfloat16))  # the model holds them rounded


def _rl_update(model, tok, tmp_path, stage="papo_rl", extra=()):
    cfg = load_config(
        profile="tiny", overrides=[f"{stage}.lr=1e-7", f"{stage}.engine_mode=sequential", *extra]
    )
    problems = generate_problems(4, seed=1)
    trainer = RLTrainer(rl_job(stage, cfg), model, tok, problems, problems, tmp_path)
    stats = trainer._update(random_rollout_groups(len(tok)), Counter())
    return trainer, stats


def test_an_rl_update_at_lr_1e_7_moves_bf16_weights_as_fp32_does(world, tmp_path):
    model, tok = world
    before = {n: p.detach().float().clone() for n, p in model.named_parameters()}
    fp32_model = _copy(model)
    _rl_update(fp32_model, tok, tmp_path / "fp32")
    bf16_model = _copy(model, torch.bfloat16)
    trainer, _ = _rl_update(bf16_model, tok, tmp_path / "bf16")
    assert isinstance(trainer.optimizer, MasterWeightAdamW)
    names = [n for n, _ in bf16_model.named_parameters()]
    masters = dict(zip(names, trainer.optimizer.master_params, strict=True))
    start = {n: p.to(torch.bfloat16).float() for n, p in before.items()}  # what the bf16 run started from
    for name, p in fp32_model.named_parameters():
        fp32_delta = p.detach() - before[name]
        mp_delta = masters[name] - start[name]
        changed = fp32_delta != 0
        assert float(changed.float().mean()) > 0.5, name
        # Adam's first step is lr * g/|g|: the same move wherever the bf16 and fp32 gradients agree in sign
        agree = float(((mp_delta - fp32_delta).abs() < 1e-9)[changed].float().mean())
        assert agree > 0.9, (name, agree)


SFT = SFTSettings(
    mode="sequential",
    total_steps=4,
    batch_size=2,
    grad_accum=2,
    lr=1e-7,
    weight_decay=0.1,
    save_every=2,
    seed=3,
)


def test_an_sft_step_at_lr_1e_7_moves_bf16_weights_as_fp32_does(world):
    model, tok = world
    examples = sequential_sft_examples(tok, 8)[:4]
    moved = {}
    for dtype in (torch.float32, torch.bfloat16):
        m = _copy(model, dtype)
        opt = build_optimizer(m, SFT)
        before = {id(p): p.detach().float().clone() for p in m.parameters()}
        _train_step(m, opt, build_scheduler(opt, SFT), examples, SFT, tok.pad_token_id, None)
        if isinstance(opt, MasterWeightAdamW):  # the fp32 masters, paired with their model parameters
            after = dict(zip(map(id, opt.model_params), opt.master_params, strict=True))
        else:
            after = {id(p): p.detach() for p in m.parameters()}
        moved[dtype] = sum(float((after[k] != b).sum()) for k, b in before.items()) / sum(
            b.numel() for b in before.values()
        )
    assert moved[torch.float32] > 0.5
    assert moved[torch.bfloat16] == pytest.approx(moved[torch.float32], abs=0.05)


def test_a_resumed_bf16_sft_run_is_byte_identical_to_an_unbroken_one(world, tmp_path):
    model, tok = world
    examples = sequential_sft_examples(tok, 8)
    source = lambda step: [examples[(step * 4 + i) % len(examples)] for i in range(4)]  # noqa: E731
    settings = SFTSettings(**{**SFT.__dict__, "lr": 1e-4})
    unbroken = _copy(model, torch.bfloat16)
    train_sft(unbroken, source, settings, tmp_path / "a", pad_id=tok.pad_token_id, show_progress=False)

    def crash_at_3(step, record):
        if step == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):  # dies after step 3, its newest checkpoint is step 2's
        train_sft(
            _copy(model, torch.bfloat16),
            source,
            settings,
            tmp_path / "b",
            pad_id=tok.pad_token_id,
            on_step=crash_at_3,
            show_progress=False,
        )
    resumed = _copy(model, torch.bfloat16)  # a fresh process: weights from the checkpoint, masters too
    result = train_sft(
        resumed, source, settings, tmp_path / "b", pad_id=tok.pad_token_id, show_progress=False
    )
    assert result.start_step == 2
    for (name, a), b in zip(unbroken.state_dict().items(), resumed.state_dict().values(), strict=True):
        assert a.dtype == torch.bfloat16 and torch.equal(a, b), name
    masters_a = torch.load(tmp_path / "a" / "checkpoint-00000004" / "optimizer.pt", weights_only=True)
    masters_b = torch.load(tmp_path / "b" / "checkpoint-00000004" / "optimizer.pt", weights_only=True)
    assert all(
        x.dtype == torch.float32 and torch.equal(x, y)
        for x, y in zip(masters_a["master_weights"], masters_b["master_weights"], strict=True)
    )


def test_a_resume_in_another_precision_is_refused(world, tmp_path):
    model, tok = world
    examples = sequential_sft_examples(tok, 4)
    source = lambda step: examples  # noqa: E731
    settings = SFTSettings(**{**SFT.__dict__, "total_steps": 1, "save_every": 1})
    train_sft(_copy(model), source, settings, tmp_path, pad_id=tok.pad_token_id, show_progress=False)
    more = SFTSettings(**{**settings.__dict__, "total_steps": 2})
    with pytest.raises(ValueError, match="run.dtype it was written with"):
        train_sft(
            _copy(model, torch.bfloat16), source, more, tmp_path, pad_id=tok.pad_token_id, show_progress=False
        )


def test_float16_training_is_refused_with_the_setting_named(world):
    with pytest.raises(PrecisionError, match="run.dtype"):
        build_adamw(_copy(world[0], torch.float16), lr=1e-6, betas=(0.9, 0.99))


# ------------------------------------------------------------------------------------ devices
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    ("stage", "extra"),
    [
        ("papo_rl", ("papo_rl.engine_mode=parallel",)),  # PAPO on the parallel 4D-mask layout
        ("npr_zero", ("npr_zero.mini_batches=2", "npr_zero.micro_batch_size=5")),  # DAPO with old log-probs
    ],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_an_rl_update_keeps_every_tensor_on_the_model_device(world, tmp_path, device, stage, extra, dtype):
    model, tok = world
    on_device = _copy(model, dtype, device)
    cfg = load_config(profile="tiny", overrides=list(extra))
    problems = generate_problems(4, seed=1)
    trainer = RLTrainer(rl_job(stage, cfg), on_device, tok, problems, problems, tmp_path)
    groups = random_rollout_groups(len(tok)) if stage != "papo_rl" else _parallel_groups(tok, cfg)
    with FakeScalars():
        stats = trainer._update(groups, Counter())
    assert stats["actor/optimizer_steps"] >= 1
    assert all(p.device.type == device for p in on_device.parameters())
    if device != "meta":
        assert all(torch.isfinite(torch.tensor(v)) for v in stats.values())


def _parallel_groups(tok, cfg) -> list[list[Rollout]]:
    from components.data.synthetic import expression_of, render_parallel
    from components.prompts import render_prompt

    tags = TagIds.from_tokenizer(tok, "npr")
    assert tags is not None
    rng = random.Random(3)
    groups = []
    for g, p in enumerate(generate_problems(3, seed=5)):
        prompt = tok.encode(
            render_prompt(tok, p["problem"], cfg.prompts, "parallel"), add_special_tokens=False
        )
        rows = []
        for _ in range(3):
            text = render_parallel(expression_of(p), rng)
            rows.append(
                Rollout(
                    group_id=f"g{g}",
                    problem_id=p["id"],
                    answer=p["answer"],
                    prompt_ids=prompt,
                    response_ids=tok.encode(text, add_special_tokens=False) + [tok.eos_token_id],
                    text=text,
                    finish_reason="stop",
                    parallel_taken=True,
                    reward=float(rng.choice([-1.0, 1.0])),
                )
            )
        groups.append(rows)
    return groups


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", ["sequential", "parallel"])
def test_an_sft_step_keeps_every_tensor_on_the_model_device(world, device, mode):
    model, tok = world
    on_device = _copy(model, torch.bfloat16, device)
    settings = SFTSettings(**{**SFT.__dict__, "mode": mode})
    rng = random.Random(0)
    examples = []
    for i, rec in enumerate(synthetic.generate_problems(4, 0, {"easy": 1.0})):
        prompt = tok.apply_chat_template(
            [{"role": "user", "content": rec["problem"]}], tokenize=False, add_generation_prompt=True
        )
        examples.append(encode_example(tok, prompt, synthetic.render_solution(rec, mode, rng), i))
    tags = TagIds.from_tokenizer(tok, "npr") if mode == "parallel" else None
    opt = build_optimizer(on_device, settings)
    with FakeScalars():
        record = _train_step(
            on_device, opt, build_scheduler(opt, settings), examples, settings, tok.pad_token_id, tags
        )
    assert record["loss_tokens"] > 0


# ------------------------------------------------------------------------------------ run.autocast
class MatmulDtypes(TorchDispatchMode):
    """Records the dtype of every matmul-like op (mm, addmm, bmm) that runs while it is active."""

    OPS = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default}

    def __init__(self):
        super().__init__()
        self.dtypes: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in self.OPS:
            self.dtypes[args[-1].dtype] += 1
        return func(*args, **(kwargs or {}))


def test_compute_autocast_is_a_no_op_without_a_dtype_and_refuses_float16():
    x, w = torch.randn(2, 4), torch.randn(3, 4)
    with compute_autocast(None, "cpu"):
        assert torch.nn.functional.linear(x, w).dtype == torch.float32
    with compute_autocast("bfloat16", "cpu"):
        assert torch.nn.functional.linear(x, w).dtype == torch.bfloat16
    with pytest.raises(PrecisionError, match="only bfloat16"):
        compute_autocast("float16", "cpu")


@pytest.mark.parametrize("mode", ["sequential", "parallel"])
def test_an_autocast_sft_step_computes_in_bf16_over_fp32_weights(world, mode):
    """The forward's (and so the backward's) matmuls run in bf16; weights, grads and AdamW stay fp32; the
    loss is the fp32 step's to bf16 rounding."""
    model, tok = world
    examples = sequential_sft_examples(tok, 8)[:4]
    tags = TagIds.from_tokenizer(tok, "npr") if mode == "parallel" else None
    losses, seen = {}, {}
    for autocast in (None, "bfloat16"):
        settings = SFTSettings(**{**SFT.__dict__, "mode": mode, "lr": 1e-3, "autocast": autocast})
        m = _copy(model)
        opt = build_optimizer(m, settings)
        with MatmulDtypes() as rec:
            out = _train_step(m, opt, build_scheduler(opt, settings), examples, settings, tok.pad_token_id, tags)
        losses[autocast], seen[autocast] = out["loss"], rec.dtypes
        assert all(p.dtype == torch.float32 for p in m.parameters())
        assert all(v.dtype == torch.float32 for s in opt.state.values() for v in s.values() if v.dim())
    assert set(seen[None]) == {torch.float32}
    assert seen["bfloat16"][torch.bfloat16] > seen["bfloat16"][torch.float32]
    assert losses["bfloat16"] == pytest.approx(losses[None], rel=1e-2)
    assert losses["bfloat16"] != losses[None]  # it did change the arithmetic


def test_run_autocast_reaches_the_rl_update(world, tmp_path):
    model, tok = world
    seen = {}
    for autocast in ("null", "bfloat16"):
        m = _copy(model)
        with MatmulDtypes() as rec:
            _rl_update(m, tok, tmp_path / autocast, extra=[f"run.autocast={autocast}"])
        seen[autocast] = rec.dtypes
        assert all(p.dtype == torch.float32 for p in m.parameters())
    assert set(seen["null"]) == {torch.float32}
    assert seen["bfloat16"][torch.bfloat16] > 0


# --------------------------------------------------------------------------- run.autocast: auto (issue 43)
from components.settings import RunConfig  # noqa: E402
from components.training import precision  # noqa: E402


@pytest.fixture()
def cpu_reports(monkeypatch):
    """Make torch report a CPU: its bf16 flags and the capability it dispatches to (the decision is cached
    per process, so the cache is cleared around each case)."""

    def report(avx512_bf16: bool, amx: bool, capability: str, onednn: str | None = None) -> None:
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
        monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
        if onednn is None:
            monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
        else:
            monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", onednn)
        precision._resolve.cache_clear()

    yield report
    precision._resolve.cache_clear()


@pytest.mark.parametrize(
    "avx512_bf16, amx, capability, onednn, expected",
    [
        (False, False, "AVX2", None, None),  # the common AVX2 core: bf16 would be emulated
        (False, False, "AVX512", None, None),  # AVX-512 without its bf16 extension: still emulated
        (True, False, "AVX512", None, "bfloat16"),  # AVX512-BF16
        (False, True, "AVX512", None, "bfloat16"),  # AMX
        (True, True, "AVX2", None, None),  # ATEN_CPU_CAPABILITY=avx2 on a bf16 machine: the emulation
        (True, False, "AVX512", "AVX2", None),  # oneDNN capped below bf16
        (True, False, "AVX512", "avx512_core_amx", "bfloat16"),  # a cap that keeps bf16
    ],
)
def test_auto_picks_bf16_only_where_the_cpu_computes_it_natively(
    cpu_reports, avx512_bf16, amx, capability, onednn, expected
):
    cpu_reports(avx512_bf16, amx, capability, onednn)
    choice = precision.resolve_autocast("auto", "cpu")
    assert choice.dtype == expected
    assert choice.setting == "auto" and choice.reason.startswith("auto: ")
    assert ("emulated" in choice.reason) == (expected is None)
    inside = precision.compute_autocast("auto", "cpu")
    with inside:
        assert torch.is_autocast_enabled("cpu") == (expected == "bfloat16")


def test_an_explicit_autocast_wins_over_the_machine(cpu_reports):
    cpu_reports(False, False, "AVX2")
    assert precision.resolve_autocast("bfloat16", "cpu").dtype == "bfloat16"
    with precision.compute_autocast("bfloat16", "cpu"):
        assert torch.get_autocast_dtype("cpu") == torch.bfloat16 and torch.is_autocast_enabled("cpu")
    assert precision.resolve_autocast(None, "cpu").dtype is None
    cpu_reports(True, True, "AVX512")
    assert precision.resolve_autocast(None, "cpu").dtype is None


def test_auto_on_this_machine_matches_what_torch_reports():
    # no monkeypatching: the real decision agrees with torch's own flags and capability
    precision._resolve.cache_clear()
    native = (torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()) and (
        torch.backends.cpu.get_cpu_capability().startswith("AVX512")
    )
    choice = precision.run_precision(RunConfig(autocast="auto"))
    assert (choice.dtype == "bfloat16") == bool(native)
    record = choice.as_dict("float32")
    assert record["autocast"] == "auto" and record["compute_dtype"] in ("bfloat16", "float32")
    precision._resolve.cache_clear()


def test_a_cuda_run_without_cuda_records_its_precision_without_raising(cpu_reports):
    cpu_reports(True, True, "AVX512")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    choice = precision.run_precision(RunConfig(device="cuda", autocast="auto"))
    assert choice.dtype is None and "no CUDA device" in choice.reason


def test_an_unknown_autocast_is_refused():
    with pytest.raises(PrecisionError, match="float16"):
        precision.resolve_autocast("float16", "cpu")
