"""playbooks/diagnose.yml end to end, on this machine, with doubles for every tool that would touch anything.

spark-1 is this machine through the local connection, with a PATH that holds
only doubles of docker, systemctl and journalctl (each prints secrets the
archive must not hold) and the few real programs Ansible and the harmless
probes need (uname, df, free, uptime, ip); nvidia-smi and rdma are not there, so
their errors are recorded and the RDMA sysfs tree (a temporary one) is read
instead. spark-2 listens nowhere (ssh to a closed port on loopback): it must
be named as unreachable without stopping the collection from spark-1. Every
shared path points into the temporary folder; nothing else is written.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DIGEST = "sha256:" + "ab" * 32
REVISION = "0123456789abcdef0123456789abcdef01234567"
MASK = "********"
# The run's result and its temporary folder.
Collected = tuple[subprocess.CompletedProcess[str], Path]

# Every secret the doubles and the node's files print; none may be in the archive.
VAULT_TOKEN = "vault-token-d1agn0se"
HF_PATTERN_TOKEN = "hf_AbCdEfGhIjKlMnOpQrStUv"
API_KEY = "sk-api-key-never-shown"
JOURNAL_BEARER = "eyJhbGciOi.bearer.never"
ENV_SECRET = "inspect-env-secret-value"
RENDER_KEY = "render-api-key-never-shown"
FABRIC_SECRET = "fabric-password-value"
SECRETS = (VAULT_TOKEN, HF_PATTERN_TOKEN, API_KEY, JOURNAL_BEARER, ENV_SECRET, RENDER_KEY, FABRIC_SECRET)

DOCKER = f"""#!/bin/sh
case "$1" in
  logs) echo "2026-01-01T00:00:00Z INFO non-default args: {{'api_key': ['{API_KEY}'], 'max_num_seqs': 4}}"
        echo "2026-01-01T00:00:01Z token from the vault: {VAULT_TOKEN}"
        echo "2026-01-01T00:00:02Z WARNING using HF_TOKEN={HF_PATTERN_TOKEN}" >&2 ;;
  inspect) cat <<'EOF'
[{{"Name": "/lab-tp2-rank0", "Config": {{"Env": ["HF_TOKEN={ENV_SECRET}", "NCCL_IB_HCA=rocep1s0f1", "PATH=/usr/bin"],
  "Cmd": ["vllm", "serve", "/models/m", "--api-key", "{API_KEY}", "--port", "8000"],
  "Labels": {{"sparkserve.deployment": "lab-tp2"}}}}, "State": {{"Running": true}}}}]
EOF
  ;;
  ps) printf 'NAMES\\tSTATUS\\nlab-tp2-rank0\\tUp 2 minutes\\n' ;;
  *) echo "Cannot connect to the Docker daemon at unix:///var/run/docker.sock" >&2; exit 1 ;;
esac
"""
SYSTEMCTL = """#!/bin/sh
echo "System has not been booted with systemd as init system (PID 1). Can't operate." >&2
exit 1
"""
JOURNALCTL = f"""#!/bin/sh
echo "Jan 01 00:00:00 spark-1 python3[42]: GET /v1/models Authorization: Bearer {JOURNAL_BEARER}"
echo "Jan 01 00:00:01 spark-1 python3[42]: args: $*"
"""
# The real programs the local connection and the harmless probes use.
REAL = ("sh", "mkdir", "chmod", "rm", "sleep", "cat", "ls", "echo", "uname", "df", "free", "uptime", "ip", "ssh", "id")


def playbook_bin() -> str:
    """ansible-playbook beside the running interpreter (the project's venv)."""
    beside = Path(sys.executable).parent / "ansible-playbook"
    found = str(beside) if beside.exists() else shutil.which("ansible-playbook")
    assert found, "ansible-playbook is not installed"
    return found


def doubles(tmp_path: Path) -> str:
    """A PATH of the doubles and the real programs above, and nothing else (no nvidia-smi, no rdma, no ip)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in {"docker": DOCKER, "systemctl": SYSTEMCTL, "journalctl": JOURNALCTL}.items():
        (bin_dir / name).write_text(text, encoding="utf-8")
        (bin_dir / name).chmod(0o755)
    for name in REAL:
        found = shutil.which(name)
        if found:
            (bin_dir / name).symlink_to(found)
    return str(bin_dir)


def node_files(tmp_path: Path) -> dict[str, str]:
    """The shared paths, in the temporary folder, with the files the engine, fabric and memguard roles write."""
    data, config, locks = tmp_path / "data", tmp_path / "etc", tmp_path / "locks"
    state = data / "deployments" / "lab-tp2"
    state.mkdir(parents=True)
    (state / "current.json").write_text(json.dumps({
        "deployment": "lab-tp2", "fingerprint": "f" * 64,
        "ranks": {"0": {"container_name": "lab-tp2-rank0", "argv": ["vllm", "serve", "--api-key", RENDER_KEY]}},
        "recipe": {"expect": {"eos_token_id": 154828}},
    }, indent=4), encoding="utf-8")
    config.mkdir()
    (config / "fabric.env").write_text(
        f"NCCL_IB_HCA=rocep1s0f1,roceP2p1s0f1\nNCCL_SOCKET_IFNAME=enp1s0f1np1\nDB_PASSWORD={FABRIC_SECRET}\n",
        encoding="utf-8")
    locks.mkdir()
    (locks / "lab-tp2.lock").write_text('{"owner": "controller pid 1", "token": "abc"}\n', encoding="utf-8")
    (tmp_path / "meminfo").write_text("MemTotal: 134217728 kB\nMemAvailable: 100663296 kB\n", encoding="ascii")
    port = tmp_path / "sys" / "rocep1s0f1" / "ports" / "1"
    port.mkdir(parents=True)
    (port / "state").write_text("4: ACTIVE\n", encoding="ascii")
    (port / "phys_state").write_text("5: LinkUp\n", encoding="ascii")
    return {
        "sparkserve_data_dir": str(data), "sparkserve_config_dir": str(config), "sparkserve_lock_dir": str(locks),
        "sparkserve_meminfo_path": str(tmp_path / "meminfo"),
    }


def inventory(tmp_path: Path) -> Path:
    """A cluster file of two nodes on loopback: spark-1 is this machine, spark-2 answers nowhere."""
    folder = tmp_path / "inventory"
    (folder / "host_vars").mkdir(parents=True)
    variables = {
        "ansible_connection": "local", "ansible_python_interpreter": sys.executable,
        "lab_engine_image": f"sparkserve-lab-registry:5000/sparkserve/engine@{DIGEST}",
        "lab_model_revision": REVISION, "lab_release_revision": REVISION,
        "weights_hf_token": VAULT_TOKEN,
        "diagnose_artifacts_dir": str(tmp_path / "artifacts"),
        **node_files(tmp_path),
    }
    cluster = {
        "plugin": "sparkserve.deploy.spark_cluster", "recipe": "lab-tp2", "management_subnet": "127.0.0.0/24",
        "fabric": {"mtu": 9000, "rdma_sysfs_root": str(tmp_path / "sys"), "twins": [
            {"interface": "enp1s0f1np1", "rdma_device": "rocep1s0f1", "subnet": "10.77.1.0/24"},
            {"interface": "enP2p1s0f1np1", "rdma_device": "roceP2p1s0f1", "subnet": "10.77.2.0/24"}]},
        "nodes": [{"name": "spark-1", "address": "127.0.0.11"}, {"name": "spark-2", "address": "127.0.0.12"}],
        "vars": variables,
    }
    (folder / "cluster.sparks.yml").write_text(yaml.safe_dump(cluster, sort_keys=False), encoding="utf-8")
    # ssh to a port nothing listens on: refused at once.
    (folder / "host_vars" / "spark-2.yml").write_text(yaml.safe_dump({
        "ansible_connection": "ssh", "ansible_port": 1, "ansible_ssh_common_args": "-o ConnectTimeout=5",
    }), encoding="utf-8")
    return folder / "cluster.sparks.yml"


@pytest.fixture(scope="module")
def collected(tmp_path_factory: pytest.TempPathFactory) -> Collected:
    tmp_path = tmp_path_factory.mktemp("diagnose")
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_FORCE_COLOR="0", ANSIBLE_NOCOLOR="1",
               ANSIBLE_CACHE_PLUGIN="memory", ANSIBLE_LOCAL_TEMP=str(tmp_path / ".ansible-local"),
               ANSIBLE_REMOTE_TEMP=str(tmp_path / ".ansible-remote"), ANSIBLE_SHOW_CUSTOM_STATS="1",
               ANSIBLE_SSH_CONTROL_PATH_DIR=str(tmp_path / ".cp"), PATH=doubles(tmp_path))
    env.pop("HF_TOKEN", None)
    done = subprocess.run(
        [playbook_bin(), "-i", str(inventory(tmp_path)), str(ROOT / "playbooks" / "diagnose.yml"), "-v"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False,
    )
    return done, tmp_path


def archive_members(tmp_path: Path) -> dict[str, str]:
    """The one archive's files, by path below its top folder."""
    archives = list((tmp_path / "artifacts").glob("*.tar.gz"))
    assert len(archives) == 1, archives
    with tarfile.open(archives[0]) as tar:
        files = {}
        for member in tar.getmembers():
            if member.isfile():
                extracted = tar.extractfile(member)
                assert extracted is not None
                files[member.name] = extracted.read().decode("utf-8")
    return files


def test_the_run_succeeds_and_names_the_archive(collected: Collected) -> None:
    done, tmp_path = collected
    out = " ".join(done.stdout.split())
    assert done.returncode == 0, done.stdout + done.stderr
    archives = list((tmp_path / "artifacts").glob("lab-tp2-*.tar.gz"))
    assert len(archives) == 1 and re.fullmatch(r"lab-tp2-\d{8}T\d{6}Z\.tar\.gz", archives[0].name), archives
    assert f"{archives[0]}: 1 of 2 nodes collected, did not answer: spark-2" in out
    # set_stats, as ansible-runner reads it.
    assert f"RUN: sparkserve_diagnose: archive: {archives[0]}" in out
    assert oct(archives[0].stat().st_mode & 0o777) == "0o600"
    # The staging folder is gone; the archive is all that is left.
    assert [p.name for p in (tmp_path / "artifacts").iterdir()] == [archives[0].name]


def test_no_secret_is_in_the_archive_or_the_output(collected: Collected) -> None:
    done, tmp_path = collected
    files = archive_members(tmp_path)
    for secret in SECRETS:
        assert secret not in done.stdout + done.stderr, secret
        leaks = [name for name, text in files.items() if secret in text]
        assert not leaks, f"{secret} is in {leaks}"


def test_every_probe_of_the_node_that_answers_is_saved(collected: Collected) -> None:
    files = {name.split("/", 1)[1]: text for name, text in archive_members(collected[1]).items()}
    top = {name.split("/")[0] for name in archive_members(collected[1])}
    assert len(top) == 1 and top.pop().startswith("lab-tp2-")

    logs = files["spark-1/containers/lab-tp2-rank0.logs.txt"]
    assert logs.startswith("$ docker logs --timestamps --tail 5000 lab-tp2-rank0\nexit status 0\n")
    assert f"'api_key': [{MASK}], 'max_num_seqs': 4" in logs
    assert f"token from the vault: {MASK}" in logs
    assert f"--- stderr\n2026-01-01T00:00:02Z WARNING using HF_TOKEN={MASK}" in logs

    inspect = json.loads(files["spark-1/containers/lab-tp2-rank0.inspect.json"])
    assert inspect[0]["Config"]["Env"] == [f"HF_TOKEN={MASK}", "NCCL_IB_HCA=rocep1s0f1", "PATH=/usr/bin"]
    assert inspect[0]["Config"]["Cmd"] == ["vllm", "serve", "/models/m", "--api-key", MASK, "--port", "8000"]

    # No systemd here: what systemctl said is saved, and the journal is asked the way the brief says.
    for unit in ("sparkserve-memguard.service", "sparkserve-flusher@lab-tp2.service"):
        assert "exit status 1\n" in files[f"spark-1/units/{unit}.show.txt"]
        assert "System has not been booted with systemd" in files[f"spark-1/units/{unit}.status.txt"]
        journal = files[f"spark-1/units/{unit}.journal.txt"]
        assert f"Authorization: Bearer {MASK}" in journal or f"Authorization: {MASK}" in journal
        assert f"args: -u {unit} --no-pager -n 2000" in journal

    # Tools that are not there: the error, not a failed run.
    assert files["spark-1/host/nvidia-smi.txt"] == (
        "$ nvidia-smi\nexit status 2\nerror: nvidia-smi could not be run: no such program on the node\n")
    assert "error: rdma could not be run: no such program on the node" in files["spark-1/fabric/rdma-link.txt"]
    assert files["spark-1/fabric/ip-addr.txt"].startswith("$ ip -d addr\nexit status 0\n")
    sysfs = files["spark-1/fabric/rdma-sysfs.yml"]
    assert sysfs.startswith(f"# {collected[1]}/sys, read as rdma link show did not answer\n")
    device = yaml.safe_load(sysfs)["devices"][0]
    assert (device["name"], device["state"], device["phys_state"]) == ("rocep1s0f1", "ACTIVE", "LinkUp")
    assert "exit status 1\n" in files["spark-1/containers/docker-info.txt"]
    assert "lab-tp2-rank0\tUp 2 minutes" in files["spark-1/containers/docker-ps.txt"]

    assert files["spark-1/host/kernel.txt"].startswith("$ uname -a\nexit status 0\n")
    assert "MemAvailable: 100663296 kB" in files["spark-1/host/meminfo.txt"]
    assert "$ free -b\nexit status 0\n" in files["spark-1/host/free.txt"]
    assert files["spark-1/host/df.txt"].startswith("$ df -h / ")

    # The node's files: the render masked, numbers kept; a missing file says so.
    current = json.loads(files["spark-1/state/current.json"])
    assert current["ranks"]["0"]["argv"] == ["vllm", "serve", "--api-key", MASK]
    assert current["recipe"]["expect"]["eos_token_id"] == 154828
    previous = files["spark-1/state/previous.json.txt"]
    assert previous.startswith(f"not read: {collected[1]}/data/deployments/lab-tp2/previous.json: ")
    assert previous.endswith("\n") and previous.count("\n") == 1
    assert '"owner": "controller pid 1"' in files["spark-1/state/lock.json"]
    assert files["spark-1/fabric/fabric.env"] == (
        f"NCCL_IB_HCA=rocep1s0f1,roceP2p1s0f1\nNCCL_SOCKET_IFNAME=enp1s0f1np1\nDB_PASSWORD={MASK}\n")


def test_the_node_that_does_not_answer_is_named(collected: Collected) -> None:
    files = {name.split("/", 1)[1]: text for name, text in archive_members(collected[1]).items()}
    assert sorted(name for name in files if name.startswith("spark-2/")) == ["spark-2/unreachable.txt"]
    assert files["spark-2/unreachable.txt"].startswith("spark-2 did not answer: ")
    summary = files["summary.txt"]
    assert "deployment: lab-tp2\nrecipe: lab-tp2\n" in summary
    assert "  spark-1 (rank 0, head): collected\n" in summary
    assert "  spark-2 (rank 1): did not answer: " in summary
    assert "\nunreachable: spark-2\n" in summary
