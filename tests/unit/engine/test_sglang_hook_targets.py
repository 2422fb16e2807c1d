"""The hook targets an NPR-merge plugin for SGLang would use exist in the pinned SGLang's source.

Reads the sglang wheel pinned in pyproject's gpu lock (downloaded with pip into a cache folder, never
installed or imported); skips with the reason when the package registry cannot be reached.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
CACHE = Path(os.environ.get("NPR_SGLANG_WHEEL_CACHE", Path.home() / ".cache" / "npr-sglang-wheel"))


def _pinned_version() -> str:
    match = re.search(r'"sglang==([0-9.]+)"', (ROOT / "pyproject.toml").read_text())
    assert match, "pyproject's gpu lock no longer pins sglang"
    return match.group(1)


@pytest.fixture(scope="module")
def sglang_source() -> zipfile.ZipFile:
    version = _pinned_version()
    CACHE.mkdir(parents=True, exist_ok=True)
    wheels = sorted(CACHE.glob(f"sglang-{version}-*.whl"))
    if not wheels:
        try:
            proc = subprocess.run(
                [sys.executable, "-m", "pip", "download", f"sglang=={version}", "--no-deps", "-d", str(CACHE)],
                capture_output=True, text=True, timeout=300,
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            pytest.skip(f"cannot download sglang=={version}: the package registry did not answer in 300 s")
        wheels = sorted(CACHE.glob(f"sglang-{version}-*.whl"))
        if proc.returncode != 0 or not wheels:
            pytest.skip(f"cannot download sglang=={version}: {proc.stderr.strip()[-300:]}")
    return zipfile.ZipFile(wheels[-1])


def _read(wheel: zipfile.ZipFile, path: str) -> str:
    return wheel.read(f"sglang/srt/{path}").decode()


def test_plugins_are_loaded_in_every_scheduler_process(sglang_source):
    plugins = _read(sglang_source, "plugins/__init__.py")
    assert 'GENERAL_PLUGINS_GROUP = "sglang.srt.plugins"' in plugins
    assert "HookRegistry.apply_hooks()" in plugins
    scheduler = _read(sglang_source, "managers/scheduler.py")
    run = scheduler.split("def run_scheduler_process(", 1)[1]
    assert run.index("load_plugins()") < run.index("configure_scheduler_process(")
    hooks = _read(sglang_source, "plugins/hook_registry.py")
    for kind in ("BEFORE", "AFTER", "AROUND", "REPLACE"):
        assert f'{kind} = "{kind.lower()}"' in hooks


def test_the_merge_hook_targets_exist(sglang_source):
    radix = _read(sglang_source, "mem_cache/radix_cache.py")
    assert "class RadixCache(" in radix and "def match_prefix(self, params: MatchPrefixParams)" in radix
    # the request reaches match_prefix (its sampling_params.custom_params can carry the response start)
    batch = _read(sglang_source, "managers/schedule_batch.py")
    assert "req=self," in batch and "custom_params" in batch
    fb = _read(sglang_source, "model_executor/forward_batch_info.py")
    assert "    def init_new(\n        cls," in fb and "ret.positions = clamp_position(batch.seq_lens)" in fb
    graphs = _read(sglang_source, "model_executor/cuda_graph_runner.py")
    assert "forward_batch.positions" in graphs  # CUDA-graph decode copies the positions init_new built
    triton = _read(sglang_source, "layers/attention/triton_backend.py")
    assert "def init_forward_metadata(self, forward_batch: ForwardBatch)" in triton
    assert "custom_mask" in triton and "mask_indptr" in triton
    kernel = _read(sglang_source, "layers/attention/triton_ops/extend_attention.py")
    # the prefix part of a custom mask is skipped by default: a merge's extend must start at the fork point
    assert "skip_prefix_custom_mask=True" in kernel


def _class_body(source: str, name: str) -> str:
    """The text of ``class name`` up to the next top-level statement."""
    body = source.split(f"\nclass {name}", 1)[1]
    return re.split(r"\n(?=\S)", body, maxsplit=1)[0]


def test_the_plugins_hooks_name_methods_of_the_pinned_sglang(sglang_source):
    """Every (target, kind) the plugin registers names a method of a class in the pinned wheel, with the
    arguments the plugin's hook takes."""
    from components.engine.backends import sglang_plugin as plugin

    signatures = {
        plugin.MATCH_PREFIX: "def match_prefix(self, params: MatchPrefixParams)",
        plugin.INIT_NEW: "def init_new(\n        cls,\n        batch: ModelWorkerBatch,\n        model_runner: ModelRunner,",
        plugin.INIT_METADATA: "def init_forward_metadata(self, forward_batch: ForwardBatch)",
    }
    assert {target for target, _, _ in plugin.HOOKS} == set(signatures)
    hooks = _read(sglang_source, "plugins/hook_registry.py")
    for target, kind, _ in plugin.HOOKS:
        module, cls, method = target.rsplit(".", 2)
        assert module.startswith("sglang.srt.")
        source = _read(sglang_source, module.removeprefix("sglang.srt.").replace(".", "/") + ".py")
        assert signatures[target] in _class_body(source, cls + "("), target
        assert f'{kind} = "{kind.lower()}"' in hooks
    fb = _read(sglang_source, "model_executor/forward_batch_info.py")
    assert (
        "    @classmethod\n    def init_new(" in fb
    )  # the registry unwraps a classmethod: the hook gets cls
    # AFTER hooks get (result, *args); AROUND hooks (original, *args)
    assert "modified = hook(result, *args, **kwargs)" in hooks
    assert "return hook(original_fn, *args, **kwargs)" in hooks


def test_what_the_plugins_hooks_read_and_write_exists(sglang_source):
    base = _read(sglang_source, "mem_cache/base_prefix_cache.py")
    assert "@dataclasses.dataclass\nclass MatchPrefixParams:" in base  # dataclasses.replace works on it
    assert "    key: RadixKey\n" in base and "    req: Optional[Req] = None" in base
    radix = _read(sglang_source, "mem_cache/radix_cache.py")
    assert "token_ids: List[int],\n        extra_key: Optional[str] = None," in radix  # RadixKey(ids, key)
    assert "return RadixKey(self.token_ids[start:stop], self.extra_key)" in radix  # key[:cut] keeps it
    assert "token_ids, req.extra_key, is_bigram=self.is_eagle" in radix  # inserts use req.extra_key
    batch = _read(sglang_source, "managers/schedule_batch.py")
    assert "self.origin_input_ids = origin_input_ids" in batch and "self.output_ids = []" in batch
    assert (
        "key=RadixKey(token_ids=token_ids, extra_key=self.extra_key),\n                    req=self," in batch
    )
    worker_batch = _class_body(batch, "ModelWorkerBatch:")
    for field in ("reqs:", "extend_seq_lens:", "extend_prefix_lens:"):
        assert f"    {field}" in worker_batch
    io = _read(sglang_source, "managers/io_struct.py")
    assert "extra_key: Optional[Union[List[str], str]] = None" in io  # a /generate field
    params = _read(sglang_source, "sampling/sampling_params.py")
    assert "custom_params: Optional[Dict[str, Any]] = None" in params
    fb = _read(sglang_source, "model_executor/forward_batch_info.py")
    assert "positions, ret.extend_start_loc = compute_position(" in fb
    triton = _read(sglang_source, "layers/attention/triton_backend.py")
    metadata = _class_body(triton, "ForwardMetadata:")
    assert "    custom_mask: torch.Tensor\n    mask_indptr: torch.Tensor\n" in metadata
    assert "self.extend_attention_fwd = torch.compiler.disable(extend_attention_fwd)" in triton
    assert "self.forward_metadata.custom_mask,\n            causal," in triton
    assert "skip_prefix_custom_mask" not in triton  # the plugin's keyword cannot collide with the call's
    kernel = _read(sglang_source, "layers/attention/triton_ops/extend_attention.py")
    # the mask layout: per request, extend rows of (prefix + extend) columns from mask_indptr
    assert (
        "* (cur_seq_len + window_kv_offset)" in kernel
        and "cur_seq_len = cur_seq_len_prefix + cur_seq_len_extend" in kernel
    )


def test_the_server_flags_the_plugin_needs_exist(sglang_source):
    from components.ops.launch import ISOLATED_MERGE_SPEC, sglang_server_command, with_isolated_merge

    argv = sglang_server_command(with_isolated_merge({"model_path": "m", "port": 1, "tp_size": 1}))
    flags = [a for a in argv if a.startswith("--")]
    assert len(flags) == 3 + 3  # model path, port, tp size and the plugin's three
    args = _read(sglang_source, "server_args.py")
    for flag in flags:
        assert f'"{flag}"' in args, flag
    assert ISOLATED_MERGE_SPEC["attention_backend"] == "triton" and '"triton"' in args


@pytest.fixture
def real_registry(sglang_source, monkeypatch):
    """The pinned SGLang's own ``hook_registry`` module (stdlib only), loaded from the wheel, with stand-in
    modules holding the three hook targets (the real ones import CUDA kernels)."""
    import types

    from components.engine.backends import sglang_plugin as plugin

    made: dict[str, types.ModuleType] = {}

    def stand_in(name: str) -> types.ModuleType:
        """``name`` and its parents as fresh modules, each an attribute of its parent (as imports leave them)."""
        parent = None
        for depth in range(1, name.count(".") + 2):
            path = ".".join(name.split(".")[:depth])
            if path not in made:
                made[path] = types.ModuleType(path)
                monkeypatch.setitem(sys.modules, path, made[path])
                if parent is not None:
                    setattr(parent, path.rsplit(".", 1)[1], made[path])
            parent = made[path]
        return parent

    module = stand_in("sglang.srt.plugins.hook_registry")
    exec(compile(_read(sglang_source, "plugins/hook_registry.py"), "hook_registry.py", "exec"), vars(module))
    targets = {}
    for target, _, _ in plugin.HOOKS:
        module_name, cls_name, method = target.rsplit(".", 2)
        owner = type(cls_name, (), {method: lambda self, *a, **k: None})
        if method == "init_new":
            owner.init_new = classmethod(lambda cls, *a, **k: None)
        targets[target] = owner
        setattr(stand_in(module_name), cls_name, owner)
    monkeypatch.setenv("NPR_SGLANG_ISOLATED_MERGE", "1")
    yield module.HookRegistry, targets
    module.HookRegistry.reset()


def test_the_plugin_checks_its_hooks_applied_under_the_real_registry(real_registry, caplog):
    from components.engine.backends import sglang_plugin as plugin

    registry, _ = real_registry
    plugin.register()
    with caplog.at_level("WARNING"):
        registry.apply_hooks()  # what SGLang's load_plugins does after every plugin registered
    assert all(plugin.hook_applied(target, hook) for target, _, hook in plugin.HOOKS)
    assert "hooks applied" in caplog.text


def test_a_hook_that_did_not_apply_stops_the_server(real_registry):
    """A target renamed in a new SGLang: the real registry logs and swallows the failure; the plugin's
    check ends the process instead of serving isolated requests as stock ones."""
    from components.engine.backends import sglang_plugin as plugin

    registry, targets = real_registry
    del targets[plugin.INIT_METADATA].init_forward_metadata
    plugin.register()
    with pytest.raises(SystemExit, match="init_forward_metadata did not apply"):
        registry.apply_hooks()
