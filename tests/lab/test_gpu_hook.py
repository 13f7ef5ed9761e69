"""Tests for the lab's stand-in NVIDIA hook (lab/node/rootfs/usr/local/bin/nvidia-container-runtime-hook)."""

from __future__ import annotations

import datetime
import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.scripts import load_script

BIN = Path(__file__).resolve().parents[2] / "lab/node/rootfs/usr/local/bin"
SCRIPT = BIN / "nvidia-container-runtime-hook"
SMI = BIN / "nvidia-smi"
ERROR = "nvidia-container-runtime-hook (sparkserve lab): error: "


def load_module() -> ModuleType:
    return load_script("lab/node/rootfs/usr/local/bin/nvidia-container-runtime-hook", "lab_gpu_hook")


hook = load_module()


def make_bundle(tmp_path: Path, root_path: str | None = None, env: list[str] | None = None) -> Path:
    """A bundle folder with an empty root filesystem at bundle/rootfs and a config.json naming it."""
    bundle = tmp_path / "bundle"
    (bundle / "rootfs").mkdir(parents=True)
    spec = {
        "ociVersion": "1.0.2-dev",
        "root": {"path": root_path or "rootfs"},
        "process": {"env": env if env is not None else ["PATH=/usr/bin:/bin", "NVIDIA_VISIBLE_DEVICES=all"]},
    }
    (bundle / "config.json").write_text(json.dumps(spec), encoding="utf-8")
    return bundle


def write_node_config(tmp_path: Path) -> Path:
    path = tmp_path / "node.json"
    path.write_text(json.dumps({"hostname": "spark-1", "gpu": {}}), encoding="utf-8")
    return path


def run_hook(tmp_path: Path, *args: str, bundle: Path | None = None,
             node_config: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "SPARKSERVE_LAB_GPU_LOG": str(tmp_path / "log" / "gpu-requests.jsonl"),
        "SPARKSERVE_LAB_NVIDIA_SMI": str(SMI),
        "SPARKSERVE_LAB_NODE_CONFIG": str(node_config or tmp_path / "absent-node.json"),
    }
    state = {"ociVersion": "1.0.2-dev", "id": "c0ffee", "status": "creating", "pid": 4242,
             "bundle": str(bundle or tmp_path / "no-bundle"), "annotations": {}}
    return subprocess.run([sys.executable, str(SCRIPT), *args], input=json.dumps(state), env=env,
                          capture_output=True, text=True, timeout=30)


def log_lines(tmp_path: Path) -> list[dict[str, object]]:
    log = tmp_path / "log" / "gpu-requests.jsonl"
    return [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()] if log.exists() else []


def test_script_is_an_executable_python3_program() -> None:
    assert SCRIPT.read_text(encoding="utf-8").startswith("#!/usr/bin/python3\n")
    assert os.access(SCRIPT, os.X_OK)


def test_defaults_match_the_nvidia_smi_double() -> None:
    smi = load_script("lab/node/rootfs/usr/local/bin/nvidia-smi", "lab_nvidia_smi_for_hook")
    assert hook.DEFAULT_NODE_CONFIG == smi.DEFAULT_CONFIG
    assert hook.NODE_CONFIG_ENV == smi.CONFIG_ENV
    assert "/" + hook.NODE_CONFIG_IN_CONTAINER == smi.DEFAULT_CONFIG


@pytest.mark.parametrize("absolute", [False, True], ids=["relative-root", "absolute-root"])
def test_prestart_logs_the_request_and_gives_the_container_nvidia_smi(tmp_path: Path, absolute: bool) -> None:
    root_path = str(tmp_path / "bundle" / "rootfs") if absolute else "rootfs"
    bundle = make_bundle(tmp_path, root_path,
                         ["NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=compute,utility"])
    rootfs = (bundle / "rootfs").resolve()
    node_config = write_node_config(tmp_path)

    result = run_hook(tmp_path, "prestart", bundle=bundle, node_config=node_config)

    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    [record] = log_lines(tmp_path)
    assert set(record) == {"time", "container_id", "visible_devices", "driver_capabilities", "rootfs"}
    assert record["container_id"] == "c0ffee"
    assert record["visible_devices"] == "all"
    assert record["driver_capabilities"] == "compute,utility"
    assert record["rootfs"] == str(rootfs)
    when = datetime.datetime.fromisoformat(str(record["time"]))
    assert when.utcoffset() == datetime.timedelta(0)

    smi = rootfs / "usr/bin/nvidia-smi"
    assert smi.read_bytes() == SMI.read_bytes()
    assert stat.S_IMODE(smi.stat().st_mode) == 0o755
    copied_config = rootfs / "etc/sparkserve-lab/node.json"
    assert copied_config.read_bytes() == node_config.read_bytes()

    listed = subprocess.run([sys.executable, str(smi), "-L"], capture_output=True, text=True, timeout=30,
                            env={**os.environ, "SPARKSERVE_LAB_NODE_CONFIG": str(copied_config)})
    assert listed.returncode == 0, listed.stdout
    assert re.fullmatch(r"GPU 0: NVIDIA GB10 \(UUID: GPU-[0-9a-f-]{36}\)\n", listed.stdout)


def test_prestart_appends_and_logs_absent_variables_as_null(tmp_path: Path) -> None:
    bundle = make_bundle(tmp_path, env=["NVIDIA_VISIBLE_DEVICES=0"])
    assert run_hook(tmp_path, "prestart", bundle=bundle).returncode == 0
    # A restarted container runs the hook again over the files of the first start.
    assert run_hook(tmp_path, "prestart", bundle=bundle).returncode == 0
    records = log_lines(tmp_path)
    assert [r["visible_devices"] for r in records] == ["0", "0"]
    assert [r["driver_capabilities"] for r in records] == [None, None]


def test_prestart_without_node_config_copies_only_nvidia_smi(tmp_path: Path) -> None:
    bundle = make_bundle(tmp_path)
    result = run_hook(tmp_path, "prestart", bundle=bundle)
    assert result.returncode == 0, result.stderr
    assert (bundle / "rootfs/usr/bin/nvidia-smi").is_file()
    assert not (bundle / "rootfs/etc/sparkserve-lab").exists()


def test_prestart_replaces_a_symlink_instead_of_writing_through_it(tmp_path: Path) -> None:
    bundle = make_bundle(tmp_path)
    victim = tmp_path / "victim"
    victim.write_text("keep\n", encoding="utf-8")
    (bundle / "rootfs/usr/bin").mkdir(parents=True)
    (bundle / "rootfs/usr/bin/nvidia-smi").symlink_to(victim)
    assert run_hook(tmp_path, "prestart", bundle=bundle).returncode == 0
    assert victim.read_text(encoding="utf-8") == "keep\n"
    assert not (bundle / "rootfs/usr/bin/nvidia-smi").is_symlink()


def test_prestart_refuses_a_folder_that_leads_out_of_the_rootfs(tmp_path: Path) -> None:
    bundle = make_bundle(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    (bundle / "rootfs/usr").mkdir()
    (bundle / "rootfs/usr/bin").symlink_to(outside)
    result = run_hook(tmp_path, "prestart", bundle=bundle)
    assert result.returncode == 1
    assert result.stderr.startswith(ERROR) and "leads out of" in result.stderr
    assert list(outside.iterdir()) == []


def test_prestart_without_bundle_config_fails(tmp_path: Path) -> None:
    result = run_hook(tmp_path, "prestart", bundle=tmp_path / "missing")
    assert result.returncode == 1
    assert result.stderr.startswith(ERROR + "cannot read bundle config")
    assert str(tmp_path / "missing" / "config.json") in result.stderr
    assert log_lines(tmp_path) == []


def test_prestart_with_bad_state_fails(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, str(SCRIPT), "prestart"], input="not json", capture_output=True,
                            text=True, timeout=30,
                            env={**os.environ, "SPARKSERVE_LAB_GPU_LOG": str(tmp_path / "log.jsonl")})
    assert result.returncode == 1
    assert result.stderr.startswith(ERROR + "OCI state on stdin is not JSON")


@pytest.mark.parametrize("command", ["poststart", "poststop"])
def test_other_hooks_do_nothing(tmp_path: Path, command: str) -> None:
    bundle = make_bundle(tmp_path)
    result = run_hook(tmp_path, command, bundle=bundle)
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")
    assert log_lines(tmp_path) == []
    assert not (bundle / "rootfs/usr").exists()


@pytest.mark.parametrize("args", [[], ["createRuntime"], ["prestart", "extra"]], ids=["none", "unknown", "extra"])
def test_usage_errors_exit_2(tmp_path: Path, args: list[str]) -> None:
    result = run_hook(tmp_path, *args, bundle=make_bundle(tmp_path))
    assert result.returncode == 2
    assert result.stderr.startswith("usage: nvidia-container-runtime-hook")
    assert log_lines(tmp_path) == []


def test_process_env_splits_at_the_first_equals_sign() -> None:
    spec = {"process": {"env": ["A=1", "B=x=y", "EMPTY=", 7]}}
    assert hook.process_env(spec) == {"A": "1", "B": "x=y", "EMPTY": ""}
    assert hook.process_env({}) == {}
