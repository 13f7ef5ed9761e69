"""Tests for the lab's nvidia-smi double (lab/node/rootfs/usr/local/bin/nvidia-smi)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.scripts import load_script

SCRIPT = Path(__file__).resolve().parents[2] / "lab/node/rootfs/usr/local/bin/nvidia-smi"
FAIL_MESSAGE = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running."
)


def load_module() -> ModuleType:
    return load_script("lab/node/rootfs/usr/local/bin/nvidia-smi", "lab_nvidia_smi")


smi = load_module()


def write_config(tmp_path: Path, gpu: dict[str, object], hostname: str = "spark-1") -> Path:
    path = tmp_path / "node.json"
    path.write_text(json.dumps({"hostname": hostname, "gpu": gpu}), encoding="utf-8")
    return path


def run_smi(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SPARKSERVE_LAB_NODE_CONFIG": str(config)}
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=30
    )


PROCS = [
    {"pid": 1234, "process_name": "python3", "used_memory_mib": 4096},
    {"pid": 5678, "process_name": "VLLM::Worker_TP0", "used_memory_mib": 90112},
]


def test_script_is_an_executable_python3_program() -> None:
    assert SCRIPT.read_text(encoding="utf-8").startswith("#!/usr/bin/python3\n")
    assert os.access(SCRIPT, os.X_OK)


def test_list_gpus_defaults_to_one_gb10_with_stable_uuid(tmp_path: Path) -> None:
    config = write_config(tmp_path, {})
    first = run_smi(config, "-L")
    assert first.returncode == 0, first.stdout
    assert re.fullmatch(
        r"GPU 0: NVIDIA GB10 \(UUID: GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\)\n",
        first.stdout,
    )
    assert run_smi(config, "--list-gpus").stdout == first.stdout
    other = run_smi(write_config(tmp_path, {}, hostname="spark-2"), "-L")
    assert other.stdout != first.stdout


def test_configured_uuid_and_name_are_listed(tmp_path: Path) -> None:
    config = write_config(tmp_path, {"uuid": "GPU-1111", "name": "NVIDIA GB10 (lab)"})
    assert run_smi(config, "-L").stdout == "GPU 0: NVIDIA GB10 (lab) (UUID: GPU-1111)\n"


def test_missing_config_file_means_defaults(tmp_path: Path) -> None:
    done = run_smi(tmp_path / "absent.json", "--query-gpu=name,driver_version,count", "--format=csv,noheader")
    assert done.returncode == 0
    assert done.stdout == "NVIDIA GB10, 580.95.05, 1\n"


def test_query_gpu_headers_units_and_gb10_unified_memory(tmp_path: Path) -> None:
    config = write_config(tmp_path, {})
    done = run_smi(
        config,
        "--query-gpu=index,name,memory.total,memory.used,memory.free,power.draw,"
        "utilization.gpu,temperature.gpu,compute_cap",
        "--format=csv",
    )
    assert done.returncode == 0
    header, row = done.stdout.splitlines()
    assert header == (
        "index, name, memory.total [MiB], memory.used [MiB], memory.free [MiB], "
        "power.draw [W], utilization.gpu [%], temperature.gpu, compute_cap"
    )
    assert row == "0, NVIDIA GB10, [N/A], [N/A], [N/A], 4.20 W, 0 %, 36, 12.1"


def test_query_gpu_noheader_nounits_keeps_na_marker(tmp_path: Path) -> None:
    config = write_config(tmp_path, {"power_draw_w": 22.5, "utilization_gpu_pct": 96})
    done = run_smi(config, "--query-gpu=memory.total,power.draw,utilization.gpu", "--format=csv,noheader,nounits")
    assert done.stdout == "[N/A], 22.50, 96\n"


def test_configured_memory_is_numeric_and_free_is_derived(tmp_path: Path) -> None:
    config = write_config(tmp_path, {"memory_total_mib": 122880, "memory_used_mib": 4096})
    with_units = run_smi(config, "--query-gpu=memory.total,memory.used,memory.free", "--format=csv,noheader")
    assert with_units.stdout == "122880 MiB, 4096 MiB, 118784 MiB\n"
    bare = run_smi(config, "--query-gpu=memory.total,memory.used,memory.free", "--format=csv,noheader,nounits")
    assert bare.stdout == "122880, 4096, 118784\n"
    only_used = run_smi(write_config(tmp_path, {"memory_used_mib": 10}), "--query-gpu=memory.used,memory.free",
                        "--format=csv,noheader")
    assert only_used.stdout == "10 MiB, [N/A]\n"


def test_query_gpu_aliases_uuid_driver_and_separate_option_values(tmp_path: Path) -> None:
    config = write_config(tmp_path, {"uuid": "GPU-abcd", "driver_version": "580.126.09"})
    done = run_smi(config, "--query-gpu", "gpu_name,gpu_uuid,uuid,driver_version,pci.bus_id", "--format", "csv")
    assert done.stdout.splitlines() == [
        "name, uuid, uuid, driver_version, pci.bus_id",
        "NVIDIA GB10, GPU-abcd, GPU-abcd, 580.126.09, 0000000F:01:00.0",
    ]


def test_query_gpu_rows_per_gpu_and_id_filter(tmp_path: Path) -> None:
    config = write_config(tmp_path, {"count": 2})
    both = run_smi(config, "--query-gpu=index,count", "--format=csv,noheader")
    assert both.stdout == "0, 2\n1, 2\n"
    one = run_smi(config, "-i", "1", "--query-gpu=index", "--format=csv,noheader")
    assert one.stdout == "1\n"
    missing = run_smi(config, "-i", "7", "-L")
    assert missing.returncode == 6
    assert "No devices were found" in missing.stdout


def test_compute_apps_listing(tmp_path: Path) -> None:
    config = write_config(tmp_path, {"compute_processes": PROCS + [{"pid": 9, "process_name": "x"}]})
    done = run_smi(config, "--query-compute-apps=pid,process_name,used_memory", "--format=csv")
    assert done.returncode == 0
    assert done.stdout.splitlines() == [
        "pid, process_name, used_gpu_memory [MiB]",
        "1234, python3, 4096 MiB",
        "5678, VLLM::Worker_TP0, 90112 MiB",
        "9, x, [N/A]",
    ]
    bare = run_smi(config, "--query-compute-apps=gpu_uuid,pid,used_gpu_memory", "--format=csv,noheader,nounits")
    uuid = run_smi(config, "--query-gpu=uuid", "--format=csv,noheader").stdout.strip()
    assert bare.stdout.splitlines() == [f"{uuid}, 1234, 4096", f"{uuid}, 5678, 90112", f"{uuid}, 9, [N/A]"]


def test_compute_apps_without_processes_prints_only_the_header(tmp_path: Path) -> None:
    config = write_config(tmp_path, {})
    done = run_smi(config, "--query-compute-apps=pid,used_memory", "--format=csv")
    assert done.stdout == "pid, used_gpu_memory [MiB]\n"
    assert run_smi(config, "--query-compute-apps=pid", "--format=csv,noheader").stdout == ""


@pytest.mark.parametrize(
    ("option", "field"),
    [("--query-gpu", "memory.bogus"), ("--query-compute-apps", "fan.speed")],
)
def test_unknown_field_fails_like_the_real_tool(tmp_path: Path, option: str, field: str) -> None:
    done = run_smi(write_config(tmp_path, {}), f"{option}=index,{field}" if option == "--query-gpu"
                   else f"{option}=pid,{field}", "--format=csv")
    assert done.returncode == 2
    assert done.stdout.splitlines()[0] == f'Field "{field}" is not a valid field to query.'


def test_unknown_option_and_bad_format_fail(tmp_path: Path) -> None:
    config = write_config(tmp_path, {})
    unknown = run_smi(config, "--frobnicate")
    assert unknown.returncode == 2
    assert "Invalid combination of input arguments" in unknown.stdout
    no_format = run_smi(config, "--query-gpu=name")
    assert no_format.returncode == 2
    assert "--format" in no_format.stdout
    bad_format = run_smi(config, "--query-gpu=name", "--format=csv,fancy")
    assert bad_format.returncode == 2
    assert '"fancy"' in bad_format.stdout
    not_csv = run_smi(config, "--query-gpu=name", "--format=noheader")
    assert not_csv.returncode == 2


@pytest.mark.parametrize("args", [(), ("-L",), ("--query-gpu=name", "--format=csv")])
def test_fail_key_simulates_a_broken_driver(tmp_path: Path, args: tuple[str, ...]) -> None:
    done = run_smi(write_config(tmp_path, {"fail": FAIL_MESSAGE}), *args)
    assert done.returncode == 9
    assert done.stdout.splitlines()[0] == FAIL_MESSAGE
    assert "GB10" not in done.stdout


def test_unreadable_config_is_an_error_not_defaults(tmp_path: Path) -> None:
    path = tmp_path / "node.json"
    path.write_text("{not json", encoding="utf-8")
    done = run_smi(path, "-L")
    assert done.returncode == 1
    assert "bad node config" in done.stderr
    assert done.stdout == ""
    wrong_type = write_config(tmp_path, {"memory_total_mib": "lots"})
    assert run_smi(wrong_type, "-L").returncode == 1


def test_summary_table_shows_not_supported_memory_and_processes(tmp_path: Path) -> None:
    done = run_smi(write_config(tmp_path, {"compute_processes": PROCS}))
    assert done.returncode == 0
    text = done.stdout
    assert "Driver Version: 580.95.05" in text
    assert "CUDA Version: 13.0" in text
    gpu_row = next(line for line in text.splitlines() if "NVIDIA GB10" in line)
    assert "Not Supported" in gpu_row
    assert re.search(r"\|\s+0\s+1234\s+python3\s+4096MiB\s+\|", text)
    assert re.search(r"\|\s+0\s+5678\s+VLLM::Worker_TP0\s+90112MiB\s+\|", text)
    empty = run_smi(write_config(tmp_path, {"memory_total_mib": 122880, "memory_used_mib": 100}))
    assert "100MiB / 122880MiB" in empty.stdout
    assert "No running processes found" in empty.stdout


def test_run_in_process_matches_the_subprocess(tmp_path: Path) -> None:
    config = write_config(tmp_path, {"compute_processes": PROCS})
    code, lines = smi.run(["--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"], str(config))
    assert (code, lines) == (0, ["1234, 4096", "5678, 90112"])
    code, lines = smi.run(["--query-gpu=nope", "--format=csv"], str(config))
    assert code == 2
    assert lines[0] == 'Field "nope" is not a valid field to query.'


def test_gpu_from_config_defaults() -> None:
    gpu = smi.gpu_from_config({"hostname": "spark-9"})
    assert (gpu.name, gpu.driver_version, gpu.count) == ("NVIDIA GB10", "580.95.05", 1)
    assert gpu.memory_total_mib is None and gpu.memory_used_mib is None
    assert gpu.processes == () and gpu.fail is None
    assert gpu.uuid == smi.gpu_from_config({"hostname": "spark-9"}).uuid
    assert smi.gpu_from_config({"gpu": {"temperature_c": 0}}).temperature_c == 0
