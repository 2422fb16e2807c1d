"""The locked environments (components.envlock): each lock was written from what pyproject.toml says now and
meets every requirement it declares, the CPU lock is the CPU build with no CUDA package, this suite runs in
exactly the CPU lock (what `make install` installs), and every stage's metrics.json names the lock and its
sha256 next to the prompt hash. Offline: the resolver itself is checked in tests/integration/ops/test_gpu_image.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement

from components import envlock

ROOT = Path(__file__).resolve().parents[3]
CPU_LOCK = ROOT / "requirements.lock"


def _requirements(tgt: envlock.Target) -> list[Requirement]:
    """Everything the target asks for: the project's requirements (extras and replacements applied) and the
    table's own requirements and constraints."""
    lines = envlock.project_requirements(tgt, ROOT) + tgt.table["requirements"] + tgt.table["constraints"]
    return [Requirement(line) for line in lines]


def _target_environment(tgt: envlock.Target) -> dict[str, str]:
    env = default_environment()
    env.update(python_version=tgt.python, python_full_version=f"{tgt.python}.0", sys_platform="linux")
    return env


def test_each_lock_was_written_from_pyproject_as_it_is_now() -> None:
    found = envlock.targets(ROOT)
    assert set(found) == {"cpu", "gpu", "vllm", "image"}
    assert found["cpu"].output == CPU_LOCK and found["gpu"].output == ROOT / "infra/gpu/requirements.txt"
    assert found["image"].output == ROOT / "infra/gpu/image-versions.lock"
    assert found["vllm"].output == ROOT / "infra/vllm/requirements.txt"
    for tgt in found.values():
        assert envlock.stale(tgt, ROOT) is None
    assert envlock.main(["check"], ROOT) == 0
    assert envlock.main(["check", "--target", "cpu"], ROOT) == (0 if sys.version_info[:2] == (3, 11) else 2)


def test_every_requirement_is_met_by_its_lock_and_overrides_win() -> None:
    for tgt in envlock.targets(ROOT).values():
        pins = envlock.read_pins(tgt.output, applicable_only=False)
        overrides = {envlock.normalize(r.name): r for r in map(Requirement, tgt.table["overrides"])}
        for req in _requirements(tgt):
            name = envlock.normalize(req.name)
            if req.marker is not None and not req.marker.evaluate(_target_environment(tgt)):
                continue
            assert name in pins, f"{tgt.output.name}: {req} is not locked"
            if name not in overrides:
                assert req.specifier.contains(pins[name], prereleases=True), (
                    f"{tgt.output.name}: {req} vs {pins[name]}"
                )
        for name, req in overrides.items():
            assert req.specifier.contains(pins[name]), (tgt.output.name, name, pins[name])
    cpu = envlock.read_pins(CPU_LOCK, applicable_only=False)
    gpu = envlock.read_pins(ROOT / "infra/gpu/requirements.txt", applicable_only=False)
    assert cpu["torch"] == "2.13.0+cpu" and not [n for n in cpu if n.startswith(("nvidia-", "cuda-"))]
    assert (gpu["torch"], gpu["transformers"], cpu["transformers"]) == ("2.11.0", "5.9.0", "5.10.4")
    # the torchvision built for torch 2.11: torch is replaced (our requirement), not overridden (everyone's)
    assert gpu["torchvision"].startswith("0.26.")
    # verl 0.9.1's v1 main_ppo imports TransferQueue: both environments carry it
    assert cpu["transferqueue"] == gpu["transferqueue"] == "0.1.11"
    # the base image's sglang is the release verl's own `sglang` extra pins
    verl_sglang = next(
        Requirement(r) for r in metadata.requires("verl") or [] if r.startswith("sglang") and "extra" in r
    )
    assert verl_sglang.specifier.contains(gpu["sglang"])


def test_orchestration_storage_and_tracking_are_the_same_versions_in_both() -> None:
    """pyproject's exact pins hold in both locks, the GPU image's torch and transformers aside."""
    cpu = envlock.read_pins(CPU_LOCK, applicable_only=False)
    gpu = envlock.read_pins(ROOT / "infra/gpu/requirements.txt", applicable_only=False)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    exact = {
        envlock.normalize(r.name): next(iter(r.specifier)).version
        for r in map(Requirement, project["dependencies"])
        if [s.operator for s in r.specifier] == ["=="]
    }
    shared = set(exact) - {"torch", "transformers"}
    assert {"prefect", "dvc", "wandb", "verl", "datasets", "boto3", "transferqueue"} <= shared
    assert {n: gpu[n] for n in shared} == {n: cpu[n] for n in shared} == {n: exact[n] for n in shared}


def _copy_project(tmp_path: Path) -> Path:
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    shutil.copy(CPU_LOCK, tmp_path / "requirements.lock")
    (tmp_path / "infra/gpu").mkdir(parents=True)
    shutil.copy(ROOT / "infra/gpu/requirements.txt", tmp_path / "infra/gpu/requirements.txt")
    shutil.copy(ROOT / "infra/gpu/image-versions.lock", tmp_path / "infra/gpu/image-versions.lock")
    (tmp_path / "infra/vllm").mkdir(parents=True)
    shutil.copy(ROOT / "infra/vllm/requirements.txt", tmp_path / "infra/vllm/requirements.txt")
    return tmp_path


def test_a_dependency_changed_without_make_lock_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = _copy_project(tmp_path)
    assert envlock.main(["check"], root) == 0
    text = (root / "pyproject.toml").read_text()
    (root / "pyproject.toml").write_text(text.replace('"rich>=13",', '"rich>=13",\n  "tabulate>=0.9",', 1))
    cpu, gpu, server, image = envlock.targets(root).values()
    assert "requirements.lock is stale" in (envlock.stale(cpu, root) or "")
    assert "[tool.npr.lock.gpu]" in (envlock.stale(gpu, root) or "")  # the image's lock is stale too
    assert "[tool.npr.lock.image]" in (envlock.stale(image, root) or "")  # and the image-versions one
    assert envlock.stale(server, root) is None  # the vLLM server's environment holds no project dependency
    assert envlock.main(["check"], root) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: requirements.lock is stale") and err.count("\n") == 0 and "make lock" in err
    # a table change alone (another Python for the image) is a change of the inputs as well
    (root / "pyproject.toml").write_text(text.replace('python = "3.12"', 'python = "3.13"'))
    cpu, gpu, _, _ = envlock.targets(root).values()
    assert envlock.stale(cpu, root) is None and envlock.stale(gpu, root)
    (root / "requirements.lock").unlink()
    assert "does not exist" in (envlock.stale(cpu, root) or "")


def test_pins_join_their_hash_lines_and_follow_their_markers(tmp_path: Path) -> None:
    lock = tmp_path / "requirements.lock"
    lock.write_text(
        "# header\n"
        "ruamel.yaml==0.19.1 \\\n    --hash=sha256:aa \\\n    --hash=sha256:bb\n    # via dvc\n"
        "async-timeout==5.0.1 ; python_full_version < '3.0' \\\n    --hash=sha256:cc\n"
        "torch==2.13.0+cpu \\\n    --hash=sha256:dd\n"
    )
    assert envlock.read_pins(lock) == {"ruamel-yaml": "0.19.1", "torch": "2.13.0+cpu"}
    assert envlock.read_pins(lock, applicable_only=False)["async-timeout"] == "5.0.1"
    lock.write_text("numpy>=2\n")
    with pytest.raises(envlock.LockError, match="is not a pin"):
        envlock.read_pins(lock)


def test_differences_follow_pips_rule_for_local_builds() -> None:
    have = {"torch": "2.11.0+cu130", "numpy": "2.4.6"}
    assert envlock.differences({"torch": "2.11.0", "numpy": "2.4.6"}, have) == []
    assert envlock.differences({"torch": "2.13.0+cpu", "rich": "14.0.0"}, {"torch": "2.13.0"}) == [
        "rich: missing (locked 14.0.0)",
        "torch: 2.13.0 (locked 2.13.0+cpu)",
    ]


def test_this_suite_runs_in_exactly_the_cpu_lock() -> None:
    """What `make install` installs on a fresh clone, and CI tests: no locked package missing or at another
    version, nothing installed that the lock does not name (the project itself aside). Under `make
    test-image` the environment is the image-versions lock, plus only its no_deps packages (SGLang's parser)."""
    if os.environ.get("NPR_TEST_IMAGE") == "1":
        image = envlock.target("image", ROOT)
        got = envlock.compare(image, envlock.installed(), ROOT)
        assert (got["mismatched"], set(got["unlocked"])) == (
            [],
            set(map(envlock.normalize, image.table["no_deps"])),
        )
        return
    env = envlock.environment(ROOT)
    assert env["lock"] == "requirements.lock"
    assert env["lock_sha256"] == hashlib.sha256(CPU_LOCK.read_bytes()).hexdigest()
    assert (env["mismatched"], env["unlocked"], env["matches"]) == ([], [], True)


def test_environment_names_the_best_matching_lock_and_what_differs(tmp_path: Path) -> None:
    root = _copy_project(tmp_path)
    pytest_version = metadata.version("pytest")
    (root / "requirements.lock").write_text(
        f"pytest=={pytest_version} \\\n    --hash=sha256:aa\nrich==0.0.1\nnot-a-package-here==1.0\n"
    )
    (root / "infra/gpu/requirements.txt").unlink()
    env = envlock.environment(root)
    assert env["lock"] == "requirements.lock" and env["matches"] is False
    assert env["lock_sha256"] == hashlib.sha256((root / "requirements.lock").read_bytes()).hexdigest()
    assert env["mismatched"] == [
        "not-a-package-here: missing (locked 1.0)",
        f"rich: {metadata.version('rich')} (locked 0.0.1)",
    ]
    assert (
        "numpy" in env["unlocked"]
        and "pytest" not in env["unlocked"]
        and "npr-pipeline" not in env["unlocked"]
    )
    (root / "requirements.lock").unlink()
    assert envlock.environment(root) == {"lock": None, "matches": False}
    (root / "pyproject.toml").unlink()
    assert envlock.environment(root) == {"lock": None, "matches": False}


def test_every_stage_records_the_lock_and_its_hash_next_to_the_prompt_hash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import components.stages as stages
    from components.config import load_config
    from components.dag import StageIO

    class Toy:
        @staticmethod
        def run(cfg, io):
            return {"x": 1}

    monkeypatch.setattr(stages, "stage_module", lambda name: Toy)
    monkeypatch.delenv("RANK", raising=False)
    io = StageIO("toy", metrics=tmp_path / "toy" / "metrics.json")
    stages.run_stage("toy", load_config(profile="tiny"), io)
    provenance = json.loads(io.metrics.read_text())["provenance"]
    assert provenance["prompt"]["prompt_hash"]
    env = provenance["environment"]
    assert env["lock"] == "requirements.lock"
    assert env["lock_sha256"] == hashlib.sha256(CPU_LOCK.read_bytes()).hexdigest()
    assert env == envlock.environment(ROOT)
    # the compute precision run.autocast resolved to on this machine, and why (issue 43)
    from components.training.precision import run_precision

    assert provenance["precision"]["autocast"] == "auto"
    assert provenance["precision"] == run_precision(load_config(profile="tiny").run).as_dict("float32")


def test_a_replacement_must_name_a_dependency(tmp_path: Path) -> None:
    root = _copy_project(tmp_path)
    text = (root / "pyproject.toml").read_text()
    (root / "pyproject.toml").write_text(
        text.replace('replace = ["torch==2.11.0"]', 'replace = ["torchx==1"]')
    )
    with pytest.raises(envlock.LockError, match="torchx is not a dependency"):
        envlock.project_requirements(envlock.target("gpu", root), root)
    assert "torch==2.11.0" in envlock.project_requirements(envlock.target("gpu", ROOT), ROOT)


def test_the_image_versions_lock_is_the_cpu_lock_with_the_images_torch_transformers_numpy() -> None:
    """`make test-image` runs the unit suite under the GPU image's versions: those three (and what they force)
    are the gpu lock's, every other package is the cpu lock's, and SGLang's parser comes from the gpu lock."""
    image_tgt = envlock.target("image", ROOT)
    image = envlock.read_pins(image_tgt.output, applicable_only=False)
    cpu = envlock.read_pins(CPU_LOCK, applicable_only=False)
    gpu = envlock.read_pins(ROOT / "infra/gpu/requirements.txt", applicable_only=False)
    assert image_tgt.python == envlock.target("gpu", ROOT).python == "3.12"
    for name in ("torch", "transformers", "numpy", "triton"):
        assert image[name] == gpu[name], name
    moved = {n for n in set(image) & set(cpu) if image[n] != cpu[n]}
    # setuptools: torch 2.11 requires < 82
    assert moved == {"torch", "transformers", "numpy", "setuptools"}, moved
    cuda = {n for n in set(image) - set(cpu) if not n.startswith(("nvidia-", "cuda-"))}
    assert cuda == {"triton"}, cuda  # what else torch 2.11's CUDA build brings: its CUDA libraries
    # python_version < 3.11.3 markers: absent on the image's 3.12
    assert set(cpu) - set(image) <= {"async-timeout"}
    reqs = envlock.no_deps_requirements(image_tgt, ROOT)
    pinned = {
        envlock.normalize(m.group(1)): m.group(2) for m in map(envlock.PIN_LINE.match, reqs.splitlines()) if m
    }
    assert pinned["sglang"] == gpu["sglang"] and pinned == {n: gpu[n] for n in pinned}
    assert all("--hash=sha256:" in block for block in reqs.split("==")[1:])
