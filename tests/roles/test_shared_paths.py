"""The paths the roles share (roles/sparkserve), through real ansible-playbook runs on this machine.

One inventory variable moves a shared path for every role that reads it; the
head is the node of rank 0 wherever it stands in the inventory; and the
preflight disk check measures the folder the weights actually go to. The
plays run with connection local against a temporary inventory: no lab, no
container, nothing outside the temporary folder is written.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]


def playbook_bin() -> str:
    """ansible-playbook beside the running interpreter (the project's venv)."""
    beside = Path(sys.executable).parent / "ansible-playbook"
    found = str(beside) if beside.exists() else shutil.which("ansible-playbook")
    assert found, "ansible-playbook is not installed"
    return found


def run_play(tmp_path: Path, play: list[dict[str, Any]], inventory: dict[str, Any], *args: str,
             path: str | None = None) -> subprocess.CompletedProcess[str]:
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play, sort_keys=False), encoding="utf-8")
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(inventory, sort_keys=False), encoding="utf-8")
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_FORCE_COLOR="0", ANSIBLE_NOCOLOR="1",
               ANSIBLE_CACHE_PLUGIN="memory", ANSIBLE_LOCAL_TEMP=str(tmp_path / ".ansible-local"))
    if path is not None:
        env["PATH"] = path
    return subprocess.run(
        [playbook_bin(), "-i", str(tmp_path / "hosts.yml"), str(tmp_path / "play.yml"), *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=180, check=False,
    )


def flat(text: str) -> str:
    """The output with the callback's line wrapping undone."""
    return " ".join(text.split())


def local_vars(**extra: Any) -> dict[str, Any]:
    return {"ansible_connection": "local", "ansible_python_interpreter": sys.executable, **extra}


# ---------------------------------------------------------------- every role follows one variable

# What each role reads of the shared paths, by the role's own variable.
ROLE_VARIABLES = [
    "weights_models_dir", "overlays_models_dir", "engine_models_dir", "preflight_weights_dir",
    "overlays_dir", "engine_overlays_dir", "engine_overrides_dir", "engine_cache_dir", "engine_state_dir",
    "memguard_events_dir", "engine_memguard_events_dir", "fabric_env_file", "engine_fabric_env_file",
    "fabric_tools_dir", "weights_tools_dir", "engine_lock_dir", "engine_gpus", "fabric_probe_gpus",
    "preflight_meminfo_path", "flusher_meminfo_path", "memguard_meminfo_path", "engine_flusher_unit",
    "weights_seeder", "sparkserve_head", "engine_logs_dir", "bench_results_dir",
]
ROLES_READ = ["weights", "overlays", "engine", "preflight", "memguard", "flusher", "fabric", "bench"]


def role_values(tmp_path: Path, hosts: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each host's value of every role variable above, as a play that lists the roles sees them.

    The roles' own tasks do not run (only the tag probe does, and the
    validation of their specs, tagged always, is skipped: the roles' inputs
    from the recipe are not there); their defaults, and those of the
    sparkserve role they depend on, are what is read.
    """
    out = tmp_path / "out"
    out.mkdir()
    play = [{
        "name": "Read the roles' defaults",
        "hosts": "sparks",
        "gather_facts": False,
        "roles": ROLES_READ,
        "tasks": [{
            "name": "Write what each role reads",
            "ansible.builtin.copy": {
                "content": "{{ {" + ", ".join(f"'{name}': {name}" for name in ROLE_VARIABLES) + "} | to_json }}",
                "dest": f"{out}/{{{{ inventory_hostname }}}}.json",
                "mode": "0644",
            },
            "delegate_to": "localhost",
            "tags": ["probe"],
        }],
    }]
    inventory = {"sparks": {"hosts": hosts, "vars": local_vars(recipe_deployment="dep")}}
    done = run_play(tmp_path, play, inventory, "--tags", "probe", "--skip-tags", "always")
    assert done.returncode == 0, done.stdout + done.stderr
    return {name: json.loads((out / f"{name}.json").read_text(encoding="utf-8")) for name in hosts}


def test_one_inventory_variable_moves_a_shared_path_for_every_role(tmp_path: Path) -> None:
    values = role_values(tmp_path, {
        # The head is the node of rank 0, not the first one listed.
        "spark-a": {"sparkserve_rank": 1},
        "spark-b": {"sparkserve_rank": 0, "sparkserve_data_dir": "/srv/ss"},
        "spark-c": {"sparkserve_rank": 2, "sparkserve_models_dir": "/data/models", "sparkserve_container_gpus": "",
                    "sparkserve_meminfo_path": "/tmp/meminfo", "sparkserve_memguard_events_dir": "/data/guard"},
    })
    plain, moved, models = values["spark-a"], values["spark-b"], values["spark-c"]

    assert {plain[v] for v in ("weights_models_dir", "overlays_models_dir", "engine_models_dir",
                               "preflight_weights_dir")} == {"/var/lib/sparkserve/models"}
    assert plain["overlays_dir"] == plain["engine_overlays_dir"] == "/var/lib/sparkserve/overlays"
    assert plain["memguard_events_dir"] == plain["engine_memguard_events_dir"] == "/var/lib/sparkserve/memguard"
    assert plain["fabric_env_file"] == plain["engine_fabric_env_file"] == "/etc/sparkserve/fabric.env"
    assert plain["fabric_tools_dir"] == plain["weights_tools_dir"] == "/var/lib/sparkserve/tools"
    assert [plain[v] for v in ("engine_overrides_dir", "engine_cache_dir", "engine_state_dir", "engine_lock_dir")] \
        == ["/var/lib/sparkserve/overrides", "/var/lib/sparkserve/cache", "/var/lib/sparkserve/deployments",
            "/run/sparkserve/locks"]
    assert plain["engine_gpus"] == plain["fabric_probe_gpus"] == "all"
    assert {plain[v] for v in ("preflight_meminfo_path", "flusher_meminfo_path", "memguard_meminfo_path")} \
        == {"/proc/meminfo"}
    assert plain["engine_flusher_unit"] == "sparkserve-flusher@dep.service"
    assert plain["sparkserve_head"] == plain["weights_seeder"] == "spark-b"
    # The controller's artifacts are beside the playbooks' folder (here the temporary play's).
    assert plain["engine_logs_dir"] == f"{tmp_path.parent}/artifacts/dep"
    assert plain["bench_results_dir"] == plain["engine_logs_dir"] + "/bench"

    # sparkserve_data_dir moves every folder below it, for every role.
    for name in ("weights_models_dir", "overlays_models_dir", "engine_models_dir", "preflight_weights_dir",
                 "overlays_dir", "engine_overlays_dir", "engine_overrides_dir", "engine_cache_dir", "engine_state_dir",
                 "memguard_events_dir", "engine_memguard_events_dir", "fabric_tools_dir", "weights_tools_dir"):
        assert moved[name] == plain[name].replace("/var/lib/sparkserve", "/srv/ss"), name
    assert moved["fabric_env_file"] == plain["fabric_env_file"]

    # sparkserve_models_dir moves the weights for the weights role and for every role that finds them there.
    assert {models[v] for v in ("weights_models_dir", "overlays_models_dir", "engine_models_dir",
                                "preflight_weights_dir")} == {"/data/models"}
    assert models["engine_overlays_dir"] == plain["engine_overlays_dir"]
    assert models["memguard_events_dir"] == models["engine_memguard_events_dir"] == "/data/guard"
    assert models["engine_gpus"] == models["fabric_probe_gpus"] == ""
    assert {models[v] for v in ("preflight_meminfo_path", "memguard_meminfo_path")} == {"/tmp/meminfo"}
    # The flusher reads the kernel's page cache, which its drops change, wherever the memory picture comes from.
    assert models["flusher_meminfo_path"] == "/proc/meminfo"
    assert models["sparkserve_head"] == "spark-b"


# ---------------------------------------------------------------- preflight's disk check

def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def doubles(tmp_path: Path) -> str:
    """A PATH whose nvidia-smi reports a good driver and no GPU process, and whose docker knows no container."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    programs = {
        "nvidia-smi": '#!/bin/sh\ncase "$*" in *driver_version*) echo 580.95.05;; esac\nexit 0\n',
        "docker": "#!/bin/sh\nexit 1\n",
    }
    for name, text in programs.items():
        (bin_dir / name).write_text(text, encoding="utf-8")
        (bin_dir / name).chmod(stat.S_IRWXU)
    return f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}"


def preflight(tmp_path: Path, min_free_disk_gib: int) -> subprocess.CompletedProcess[str]:
    """The preflight role on this machine, with the weights in a temporary folder (sparkserve_models_dir)."""
    models = tmp_path / "models"
    models.mkdir()
    (tmp_path / "meminfo").write_text("MemTotal: 134217728 kB\nMemFree: 67108864 kB\nMemAvailable: 100663296 kB\n",
                                      encoding="ascii")
    recipe = {
        "memory": {"min_available_gib": 1},
        "host": {"driver_versions": ["580."], "min_free_disk_gib": min_free_disk_gib},
        "launch": {"api_port": free_port(), "master_port": free_port(), "extra_ports": []},
    }
    inventory = {"sparks": {
        "hosts": {"spark-1": {"sparkserve_rank": 0}},
        "vars": local_vars(sparkserve_models_dir=str(models), sparkserve_meminfo_path=str(tmp_path / "meminfo"),
                           recipe_config=recipe, recipe_deployment="preflight-test"),
    }}
    play = [{"name": "Preflight this machine", "hosts": "sparks", "gather_facts": False, "roles": ["preflight"]}]
    return run_play(tmp_path, play, inventory, path=doubles(tmp_path))


def test_preflight_measures_free_disk_where_the_weights_go(tmp_path: Path) -> None:
    # More free space than any disk has: the check must fail, and name the folder it measured.
    done = preflight(tmp_path, min_free_disk_gib=1 << 40)
    out = flat(done.stdout + done.stderr)
    assert done.returncode != 0, out
    assert f"{tmp_path / 'models'} has " in out and "the weights need" in out, out
    assert "/var/lib/sparkserve" not in out


def test_preflight_passes_with_room_for_the_weights(tmp_path: Path) -> None:
    done = preflight(tmp_path, min_free_disk_gib=0)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "failed=0" in flat(done.stdout)
