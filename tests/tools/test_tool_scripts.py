"""The developer tools: the local NCCL probe runner and the weights benchmark."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.scripts import load_script

local = load_script("tools/nccl-probe-local.py", "nccl_probe_local")
bench = load_script("tools/bench-weights.py", "bench_weights")


def test_each_local_rank_gets_the_nodes_fabric_env_and_one_gpu() -> None:
    fabric = {"NCCL_IB_HCA": "mlx5_0", "NCCL_SOCKET_IFNAME": "lo"}
    env = local.rank_env({"PATH": "/bin", "NCCL_P2P_DISABLE": "0"}, fabric, 1, net_only=True)
    assert env["CUDA_VISIBLE_DEVICES"] == "1" and env["NCCL_IB_HCA"] == "mlx5_0"
    assert env["NCCL_NVLS_ENABLE"] == "0" and env["NCCL_DEBUG"] == "INFO"
    assert env["NCCL_P2P_DISABLE"] == "1" and env["NCCL_SHM_DISABLE"] == "1"
    assert "NCCL_SHM_DISABLE" not in local.rank_env({}, fabric, 0, net_only=False)


def test_local_ranks_are_the_nodes_of_one_rendezvous() -> None:
    argv = local.probe_argv("python3", 2, 1, 29599, "1,16", 5)
    assert argv[1].endswith("roles/fabric/files/sparkserve-nccl-probe.py")
    assert argv[2:] == ["--master-addr", "127.0.0.1", "--master-port", "29599", "--nnodes", "2",
                        "--node-rank", "1", "--sizes-mib", "1,16", "--iters", "5"]
    with pytest.raises(SystemExit):
        local.parse_args(["--ranks", "1"])


def test_bench_uses_the_labs_first_twin_and_a_pinned_revision() -> None:
    assert bench.fabric_ip("spark-3") == "10.77.1.13"
    assert len(bench.REVISION) == 40 and int(bench.REVISION, 16) >= 0
    args = bench.parse_args(["--rate-mbit", "200"])
    assert (args.rate_mbit, args.shards, args.shard_mib) == (200, 16, 8)


fleet = load_script("tools/bench-fleet.py", "bench_fleet")
gateway_bench = load_script("tools/bench-gateway.py", "bench_gateway")


def test_the_gateway_benchmark_reads_throughput_and_median_ttft_of_each_cell() -> None:
    results = {"cells": [{"id": "a/c1", "metrics": {"tok_s": 40.0}, "percentiles": {"ttft_ms": {"p50": 12.0}}},
                         {"id": "a/c16", "metrics": {"tok_s": 2.5}, "percentiles": {"ttft_ms": {"p50": None}}}]}
    assert gateway_bench.figures(results) == (42.5, {"a/c1": 12.0})
    assert gateway_bench.figures({"cells": []}) == (0.0, {})


def test_the_gateway_benchmark_pairs_each_cell_with_itself_in_the_same_round() -> None:
    direct = [{"a": 40.0, "b": 20.0}, {"a": 50.0, "b": 21.0}]
    gateway = [{"a": 41.0, "b": 20.5}, {"a": 50.25}]  # round 2 measured no TTFT for b through the gateway
    assert gateway_bench.ttft_added_ms(direct, gateway) == {"a": [1.0, 0.25], "b": [0.5]}


def test_the_fleet_benchmark_inventories_place_three_deployments_on_two_nodes(tmp_path: Path) -> None:
    cluster = {"plugin": "sparkserve.deploy.spark_cluster", "recipe": "lab-tp2", "user": "root",
               "fabric": {"twins": [{"interface": "enp1s0f1np1", "rdma_device": "rocep1s0f1",
                                     "subnet": "10.77.1.0/24"}]},
               "nodes": [{"name": "spark-1", "address": "172.30.77.11"},
                         {"name": "spark-2", "address": "172.30.77.12"}]}
    three = fleet.write(tmp_path / "three", cluster, fleet.THREE)
    done = subprocess.run([str(Path(sys.executable).with_name("ansible-inventory")), "-i", str(three), "--list"],
                          cwd=fleet.ROOT, env=dict(os.environ, ANSIBLE_CONFIG=str(fleet.ROOT / "ansible.cfg")),
                          capture_output=True, text=True, timeout=120, check=True)
    inventory = json.loads(done.stdout)
    assert inventory["deployment_lab_tp2"]["hosts"] == ["lab-tp2@spark-1", "lab-tp2@spark-2"]
    assert inventory["deployment_lab_tp1_b"]["hosts"] == ["lab-tp1-b@spark-2"]
    hostvars = inventory["_meta"]["hostvars"]
    # lab-tp2 keeps its recipe's 8000 on both nodes; each lab-tp1 gets the next free port on its node.
    assert "sparkserve_api_port" not in hostvars["lab-tp2@spark-1"]
    assert hostvars["lab-tp1@spark-1"]["sparkserve_api_port"] == 8001
    assert hostvars["lab-tp1-b@spark-2"]["sparkserve_api_port"] == 8001
    written = yaml.safe_load((tmp_path / "three" / "cluster.sparks.yml").read_text(encoding="utf-8"))
    assert "recipe" not in written and len(written["deployments"]) == 3
