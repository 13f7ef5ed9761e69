"""Versions known to break RDMA, NCCL or the GPU on Sparks: the data file's shape and preflight's reading of it."""

from __future__ import annotations

from pathlib import Path

import yaml

from ansible_collections.sparkserve.deploy.plugins.modules.host_preflight import known_bad_matches, node_versions

ROOT = Path(__file__).resolve().parents[2]
KNOWN_BAD = yaml.safe_load((ROOT / "roles/preflight/files/known_bad.yml").read_text(encoding="utf-8"))


def test_every_entry_says_what_breaks_how_to_fix_it_and_where_the_fact_comes_from() -> None:
    assert KNOWN_BAD, "the list is empty"
    for entry in KNOWN_BAD:
        assert entry["component"] in ("kernel", "driver", "firmware"), entry
        assert entry.get("versions") or entry.get("prefixes"), entry
        assert entry["breaks"] in ("rdma", "nccl", "gpu"), entry
        assert entry["what"].strip() and entry["fix"].strip(), entry
        assert entry["sources"] and all(s.startswith("https://") for s in entry["sources"]), entry


def test_the_kernel_that_broke_memory_registration_is_refused_where_rdma_is_needed() -> None:
    versions = {"kernel": ["7.0.0-1019-nvidia"], "driver": ["580.173.02"], "firmware": ["28.45.4028"]}
    problems, warnings = known_bad_matches(KNOWN_BAD, versions, ["ro", "quiet"], needs_rdma=True)
    assert len(problems) == 1 and problems[0].startswith("kernel 7.0.0-1019-nvidia is known to break RDMA on Sparks: "
                                                         "RDMA memory registration fails when NCCL starts")
    assert "fix: boot the 6.17.0-1032-nvidia kernel" in problems[0] and "kho=off" in problems[0]
    assert "github.com/MiaAI-Lab/DeepSeek-v4.1-Flash-DGX-Sparks/issues/14" in problems[0]
    assert len(warnings) == 1 and "NV_ERR_NO_MEMORY" in warnings[0]  # the GPU wedge warns, it refuses nothing
    # One node, or require_rdma off: a warning, not a refusal.
    problems, warnings = known_bad_matches(KNOWN_BAD, versions, [], needs_rdma=False)
    assert problems == [] and len(warnings) == 2


def test_the_workaround_on_the_kernel_command_line_and_other_kernels_pass() -> None:
    problems, warnings = known_bad_matches(KNOWN_BAD, {"kernel": ["7.0.0-1019-nvidia"]}, ["ro", "kho=off"], True)
    assert problems == [] and len(warnings) == 1  # kho=off avoids the registration failure, not the wedge
    assert known_bad_matches(KNOWN_BAD, {"kernel": ["6.17.0-1032-nvidia"]}, [], True) == ([], [])
    assert known_bad_matches(KNOWN_BAD, {"kernel": ["7.0.0-31-generic"]}, [], True)[0]  # by prefix
    assert known_bad_matches(KNOWN_BAD, {"kernel": ["7.0.0-30-generic"]}, [], True) == ([], [])


def test_the_node_versions_come_from_proc_and_the_rdma_tree(tmp_path: Path) -> None:
    (tmp_path / "sys/kernel").mkdir(parents=True)
    (tmp_path / "sys/kernel/osrelease").write_text("6.17.0-1032-nvidia\n", encoding="utf-8")
    (tmp_path / "ib/rocep1s0f1").mkdir(parents=True)
    (tmp_path / "ib/rocep1s0f1/fw_ver").write_text("28.45.4028\n", encoding="utf-8")
    params = {"rdma_devices": ["rocep1s0f1", "roceP2p1s0f1"], "rdma_sysfs_root": str(tmp_path / "ib")}
    assert node_versions(params, "580.95.05", str(tmp_path)) == {
        "kernel": ["6.17.0-1032-nvidia"], "driver": ["580.95.05"], "firmware": ["28.45.4028"]}
