"""infra/ and prefect.yaml: they parse, name entry points that exist, and agree with each other."""

from __future__ import annotations

import ast
import importlib.metadata
import json
import re
from pathlib import Path

import pytest
import yaml

from components.ops.launch import (
    LaunchSpecError,
    load_spec,
    sglang_server_command,
)
from components.ops.prefect_ops import gpu_pool_template, process_pool_template

REPO = Path(__file__).resolve().parents[3]
INFRA = REPO / "infra"
DOCKER_INSTRUCTIONS = {
    "FROM",
    "RUN",
    "CMD",
    "LABEL",
    "EXPOSE",
    "ENV",
    "ADD",
    "COPY",
    "ENTRYPOINT",
    "VOLUME",
    "USER",
    "WORKDIR",
    "ARG",
    "ONBUILD",
    "STOPSIGNAL",
    "HEALTHCHECK",
    "SHELL",
}


def _prefect() -> dict:
    return yaml.safe_load((REPO / "prefect.yaml").read_text())


def _deployment(name: str) -> dict:
    return next(d for d in _prefect()["deployments"] if d["name"] == name)


def _flow_name(entrypoint: str) -> str:
    """The @flow(name=...) of ``path.py:function``, read from the source (no import)."""
    path, func = entrypoint.split(":")
    tree = ast.parse((REPO / path).read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == func:
            for deco in node.decorator_list:
                if isinstance(deco, ast.Call) and getattr(deco.func, "id", "") == "flow":
                    names = [k.value.value for k in deco.keywords if k.arg == "name"]
                    return names[0] if names else func.replace("_", "-")
            raise AssertionError(f"{entrypoint} is not decorated with @flow")
    raise AssertionError(f"{entrypoint}: no function {func}")


def _dockerfile() -> list[tuple[str, str]]:
    text = (INFRA / "gpu" / "Dockerfile").read_text().replace("\\\n", " ")
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    return [(ln.split(None, 1)[0].upper(), ln.split(None, 1)[1] if " " in ln else "") for ln in lines]


def test_every_infra_file_parses() -> None:
    for path in sorted(INFRA.rglob("*")):
        if path.suffix in (".yaml", ".yml"):
            assert all(doc is not None for doc in yaml.safe_load_all(path.read_text())), path
        elif path.suffix == ".json":
            json.loads(path.read_text())
    instructions = _dockerfile()
    assert instructions[0][0] == "FROM"
    assert {kind for kind, _ in instructions} <= DOCKER_INSTRUCTIONS
    for kind, args in instructions:
        if kind == "COPY":
            assert (REPO / args.split()[0]).exists(), f"Dockerfile copies missing {args.split()[0]}"


def test_one_image_name_everywhere() -> None:
    image = _deployment("npr-stage")["work_pool"]["job_variables"]["image"]
    k8s = json.loads((INFRA / "k8s" / "gpu-pool-template.json").read_text())
    sglang_k8s = next(yaml.safe_load_all((INFRA / "k8s" / "sglang-server.yaml").read_text()))
    pod = sglang_k8s["spec"]["template"]["spec"]
    found = {
        "k8s pool template": k8s["variables"]["properties"]["image"]["default"],
        "ray cluster": yaml.safe_load((INFRA / "ray" / "cluster.yaml").read_text())["docker"]["image"],
        "sglang spec": load_spec(INFRA / "sglang" / "server.yaml")["image"],
        "sglang k8s": pod["containers"][0]["image"],
        "sglang k8s init": pod["initContainers"][0]["image"],
    }
    assert found == dict.fromkeys(found, image)
    tag = re.search(r"docker build .* -t (\S+) \.", (INFRA / "gpu" / "Dockerfile").read_text())
    assert tag and tag.group(1) == image
    assert f"-t {image}" in (INFRA / "README.md").read_text()


def test_gpu_requirements_follow_verls_sglang_extra() -> None:
    """Every pin of verl[sglang] is met by the image: its lock, requirements.txt, or its SGLang base (the
    torch audio build it ships; tests/integration/ops/test_gpu_image.py resolves both)."""
    from components.envlock import read_pins

    pins = read_pins(INFRA / "gpu" / "requirements.txt", applicable_only=False)
    base = re.search(
        r"^FROM lmsysorg/sglang:v(\S+)-cu(\d+)", (INFRA / "gpu" / "Dockerfile").read_text(), re.M
    )
    assert base, "the GPU image is built on SGLang's release image"
    from_base = {"sglang": base.group(1), "torchvision": "base", "torchaudio": "base"}
    requires = importlib.metadata.requires("verl")
    extra = [r for r in requires if 'extra == "sglang"' in r and "==" in r.split(";")[0]]
    assert extra, "verl's sglang extra lists no pins"
    for req in extra:
        name, version = req.split(";")[0].strip().split("==")
        name = name.lower()
        if name in pins:
            assert pins[name] == version, f"{name} must be pinned to {version} (verl[sglang])"
        else:
            assert name in from_base, f"{name}=={version} (verl[sglang]) is neither pinned nor in the base"
            assert from_base[name] in (version, "base"), f"the base image has {name} {from_base[name]}"
    assert pins["verl"] == importlib.metadata.version("verl")


def test_deployments_reference_existing_flows_and_pools() -> None:
    from flows.pipeline import NPR_STAGE_DEPLOYMENT

    names = {d["name"]: d for d in _prefect()["deployments"]}
    assert set(names) == {"npr-pipeline", "npr-stage", "nightly-eval"}
    assert _flow_name(names["npr-pipeline"]["entrypoint"]) == "npr-pipeline"
    # the pipeline dispatches gpu stages to "<flow>/<deployment>": both halves must match prefect.yaml
    assert f"{_flow_name(names['npr-stage']['entrypoint'])}/npr-stage" == NPR_STAGE_DEPLOYMENT
    assert _flow_name(names["nightly-eval"]["entrypoint"]) == "nightly-eval"
    assert names["npr-pipeline"]["work_pool"]["name"] == "cpu"
    assert names["npr-stage"]["work_pool"]["name"] == "gpu"
    assert names["nightly-eval"]["work_pool"]["name"] == "{{ $NPR_NIGHTLY_POOL }}"
    pyproject = (REPO / "pyproject.toml").read_text()
    assert 'npr = "components.cli:main"' in pyproject
    from components import cli

    assert callable(cli.main)


def test_nightly_schedule_matches_the_profiles() -> None:
    (schedule,) = _deployment("nightly-eval")["schedules"]
    for profile in ("tiny", "qwen3-4b"):
        nightly = yaml.safe_load((REPO / "configs" / f"{profile}.yaml").read_text())["nightly"]
        assert (schedule["cron"], schedule["timezone"]) == (nightly["cron"], nightly["timezone"]), profile


def test_gpu_job_variables_are_declared_by_both_pool_templates() -> None:
    used = set(_deployment("npr-stage")["work_pool"]["job_variables"])
    k8s = json.loads((INFRA / "k8s" / "gpu-pool-template.json").read_text())["variables"]["properties"]
    local = gpu_pool_template()["variables"]["properties"]
    assert used == {"image", "gpu_count", "env"}
    assert used <= set(k8s) and used <= set(local)
    assert set(local) - set(process_pool_template()["variables"]["properties"]) == {"image", "gpu_count"}


def test_sglang_command_renders_the_spec_and_matches_the_k8s_server() -> None:
    spec = load_spec(INFRA / "sglang" / "server.yaml")
    # k8s expands $(NPR_SGLANG_API_KEY) from the secret: rendering with that text gives the container's argv
    argv = sglang_server_command(spec, env={spec["api_key_env"]: f"$({spec['api_key_env']})"})
    assert argv[:3] == ["python", "-m", "sglang.launch_server"]
    assert argv[argv.index("--tp-size") + 1] == str(spec["tp_size"])
    assert argv[argv.index("--mem-fraction-static") + 1] == "0.85"
    assert argv[argv.index("--model-path") + 1] == "artifacts/npr_zero/model"
    container = next(yaml.safe_load_all((INFRA / "k8s" / "sglang-server.yaml").read_text()))
    container = container["spec"]["template"]["spec"]["containers"][0]
    # on k8s: the checkpoint pulled by its md5 (NPR_SERVE_MD5) and reported as the served weights' version
    k8s = {**spec, "model_path": "artifacts/served/model", "weight_version": "$(NPR_SERVE_MD5)"}
    assert [*container["command"], *container["args"]] == sglang_server_command(
        k8s, env={spec["api_key_env"]: f"$({spec['api_key_env']})"}
    )
    with pytest.raises(LaunchSpecError, match="unknown"):
        sglang_server_command({**spec, "tp": 2})
    with pytest.raises(LaunchSpecError, match="model_path"):
        sglang_server_command({k: v for k, v in spec.items() if k != "model_path"})


def test_ray_job_submission_of_a_stage(tmp_path, monkeypatch) -> None:
    """The job the flow submits for a verl stage on a running cluster: the spec's entrypoint, its env vars
    plus the W&B/S3/NPR settings in a 0600 runtime-env file (never on the command line), removed after."""
    import subprocess

    from components.training.verl import ray_cluster

    seen = {}

    def run(argv, env, timeout, check):
        runtime = Path(argv[argv.index("--runtime-env") + 1])
        seen.update(argv=argv, mode=runtime.stat().st_mode & 0o777, runtime=json.loads(runtime.read_text()))
        return subprocess.CompletedProcess(argv, 0)

    monkeypatch.setattr(subprocess, "run", run)
    spec = load_spec(INFRA / "ray" / "job.yaml")
    environ = {"WANDB_API_KEY": "k", "AWS_SECRET_ACCESS_KEY": "s", "HOME": "/root", "RAY_AUTH_MODE": "token"}
    ray_cluster.submit_stage_job("papo_rl", spec, "r1", "http://head:8265", tmp_path, environ)
    argv = seen["argv"]
    assert argv[1:3] == ["job", "submit"] and argv[argv.index("--address") + 1] == "http://head:8265"
    assert argv[argv.index("--submission-id") + 1] == "npr-papo_rl-r1"
    assert "k" not in argv and "s" not in argv and seen["mode"] == 0o600
    env = seen["runtime"]["env_vars"]
    assert env["NPR_PIPELINE_RUN_ID"] == "r1" and env["DVC_NO_ANALYTICS"] == "1"
    assert env["WANDB_API_KEY"] == "k" and env["AWS_SECRET_ACCESS_KEY"] == "s" and "HOME" not in env
    assert "RAY_AUTH_MODE" not in env  # the cluster's own auth settings are not overridden by a job
    assert seen["runtime"]["working_dir"] == "." and "artifacts/" in seen["runtime"]["excludes"]
    script = argv[argv.index("--") + 3]
    assert "dvc repro --pull --single-item papo_rl" in script
    assert "dvc push --run-cache -r s3 papo_rl" in script
    assert not list(tmp_path.iterdir())  # the runtime-env file (it holds keys) is gone


def test_the_ray_cluster_yaml_passes_rays_own_schema():
    """What `ray up` does before launching anything: fill the provider's defaults, then validate against the
    ray-schema.json shipped in the installed Ray (the version the image pins); a misspelled key fails."""
    from ray.autoscaler._private.util import prepare_config, validate_config

    config = yaml.safe_load((INFRA / "ray" / "cluster.yaml").read_text())
    validate_config(prepare_config(config))
    config["docker"]["pull_befor"] = True
    with pytest.raises(Exception, match="pull_befor"):
        validate_config(prepare_config(config))


K8S_VERSION = "1.30.0"  # the oldest Kubernetes whose API these manifests target (all of it GA since 1.21)


def _k8s_valid(resource: dict) -> None:
    """Strict: an unknown field fails too, as `kubectl apply --validate=strict` would."""
    import kubernetes_validate

    kubernetes_validate.validate(resource, K8S_VERSION, strict=True)


def _rendered_gpu_job() -> dict:
    """The gpu pool's Job as Prefect's kubernetes worker renders it: the template's variables (defaults plus
    what a run sets), then env as a list of name/value pairs and the command split into args (what the
    worker does to the manifest before creating it)."""
    import shlex

    from prefect.utilities.templating import apply_values

    template = json.loads((INFRA / "k8s" / "gpu-pool-template.json").read_text())
    values = {k: v.get("default") for k, v in template["variables"]["properties"].items()}
    values |= {
        "name": "npr-stage-run",
        "command": "prefect flow-run execute",
        "labels": {"prefect.io/flow-run-id": "abc"},
        "env": {**values["env"], "NPR_GIT_COMMIT": "abc"},
        "gpu_count": 8,
    }
    job = apply_values(template["job_configuration"], values)["job_manifest"]
    container = job["spec"]["template"]["spec"]["containers"][0]
    container["env"] = [{"name": k, "value": str(v)} for k, v in container["env"].items()]
    container["args"] = shlex.split(container["args"])
    return job


def test_the_k8s_manifests_pass_the_kubernetes_openapi_schema() -> None:
    import kubernetes_validate

    _k8s_valid(_rendered_gpu_job())
    documents = list(yaml.safe_load_all((INFRA / "k8s" / "sglang-server.yaml").read_text()))
    assert [d["kind"] for d in documents] == ["Deployment", "Service"]
    for document in documents:
        _k8s_valid(document)
    _k8s_valid(yaml.safe_load((INFRA / "k8s" / "work-volume.yaml").read_text()))
    broken = _rendered_gpu_job()
    broken["spec"]["template"]["spec"]["containers"][0]["volumeMount"] = []  # a typo of volumeMounts
    with pytest.raises(kubernetes_validate.ValidationError, match="volumeMount"):
        _k8s_valid(broken)


def test_the_work_volume_holds_the_disk_the_profile_plans_checkpoints_against() -> None:
    """``npr config check`` plans a verl stage's checkpoints against ``orchestration.gpu.disk_gib``; the
    claim every gpu-pool job mounts asks for exactly that."""
    from components.config import load_config

    claim = yaml.safe_load((INFRA / "k8s" / "work-volume.yaml").read_text())
    requested = claim["spec"]["resources"]["requests"]["storage"]
    assert requested.endswith("Gi")
    assert float(requested[:-2]) == load_config(profile="qwen3-4b").orchestration.gpu.disk_gib
