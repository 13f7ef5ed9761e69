"""playbooks/render.yml end to end: real inventories through the real playbook.

render.yml touches no host, so these run without a lab. The management
addresses are on loopback all the same, so nothing could leave this machine.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DIGEST = "sha256:" + "ab" * 32
REVISION = "0123456789abcdef0123456789abcdef01234567"


def playbook_bin() -> str:
    """ansible-playbook beside the running interpreter (the project's venv)."""
    beside = Path(sys.executable).parent / "ansible-playbook"
    found = str(beside) if beside.exists() else shutil.which("ansible-playbook")
    assert found, "ansible-playbook is not installed"
    return found


def cluster_file(tmp_path: Path, nodes: int = 2, recipe: str = "lab-tp2", mtu: int = 9000) -> Path:
    lines = [
        "plugin: sparkserve.deploy.spark_cluster",
        f"recipe: {recipe}",
        "management_subnet: 127.0.0.0/24",
        "fabric:",
        f"  mtu: {mtu}",
        "  twins:",
        "    - {interface: enp1s0f1np1, rdma_device: rocep1s0f1, subnet: 10.77.1.0/24}",
        "    - {interface: enP2p1s0f1np1, rdma_device: roceP2p1s0f1, subnet: 10.77.2.0/24}",
        "nodes:",
    ]
    lines += [f"  - {{name: spark-{n}, address: 127.0.0.{10 + n}}}" for n in range(1, nodes + 1)]
    lines += [
        "vars:",
        f"  lab_engine_image: sparkserve-lab-registry:5000/sparkserve/engine@{DIGEST}",
        f"  lab_model_revision: '{REVISION}'",
        f"  lab_release_revision: '{REVISION}'",
        # The lab model is gated: a token must be configured (never shown).
        "  weights_hf_token: test-token-not-shown",
    ]
    path = tmp_path / "cluster.sparks.yml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def render(inventory: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_FORCE_COLOR="0", ANSIBLE_NOCOLOR="1",
               ANSIBLE_CACHE_PLUGIN="memory")
    return subprocess.run(
        [playbook_bin(), "-i", str(inventory), str(ROOT / "playbooks" / "render.yml"), *extra],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False,
    )


def flat(text: str) -> str:
    """The output with the callback's line wrapping undone."""
    return " ".join(text.split())


def test_render_shows_every_rank(tmp_path: Path) -> None:
    done = render(cluster_file(tmp_path))
    out = flat(done.stdout)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "rank 0 on spark-1: container lab-tp2-rank0" in out
    assert "--node-rank 0 --master-addr 10.77.1.1 --master-port 29501 --host 127.0.0.1 --port 8000" in out
    assert "rank 1 on spark-2: container lab-tp2-rank1" in out
    assert "--node-rank 1 --master-addr 10.77.1.1 --master-port 29501 --headless" in out
    assert "VLLM_HOST_IP=10.77.1.2" in out and "NCCL_IB_HCA=rocep1s0f1,roceP2p1s0f1" in out
    assert "changed=0" in out and "unreachable=0" in out
    assert "test-token-not-shown" not in done.stdout + done.stderr


def test_render_touches_no_host_in_check_mode(tmp_path: Path) -> None:
    done = render(cluster_file(tmp_path), "--check")
    assert done.returncode == 0, done.stdout + done.stderr
    assert flat(done.stdout).count("--node-rank") == 2


def test_an_unknown_recipe_is_named_with_the_choices(tmp_path: Path) -> None:
    done = render(cluster_file(tmp_path, recipe="no-such-recipe"))
    out = flat(done.stdout)
    assert done.returncode != 0
    assert 'recipe "no-such-recipe" is unknown; sparkserve_recipe must be one of' in out
    assert "lab-tp2" in out and "lab-tp4" in out
    assert "did you mean" not in out


def test_a_mistyped_recipe_is_told_its_close_match(tmp_path: Path) -> None:
    done = render(cluster_file(tmp_path, recipe="lab-tp22"))
    assert done.returncode != 0
    assert ('recipe "lab-tp22" is unknown; did you mean lab-tp2 or lab-tp4? sparkserve_recipe must be one of'
            in flat(done.stdout + done.stderr))
    # The reason is also the last thing shown, after the recap.
    assert flat(done.stderr).rstrip().endswith("recipe: in a .sparks.yml).")


def test_a_recipe_for_another_cluster_size_is_refused(tmp_path: Path) -> None:
    done = render(cluster_file(tmp_path, recipe="lab-tp4"))
    out = flat(done.stdout)
    assert done.returncode != 0
    assert "recipe lab-tp4" in out and "tensor" in out and "2 nodes" in out


def test_a_bad_mtu_stops_at_the_inventory(tmp_path: Path) -> None:
    done = render(cluster_file(tmp_path, mtu=65000))
    out = flat(done.stdout + done.stderr)
    assert done.returncode != 0
    assert "65000" in out and "1280" in out and "9216" in out


@pytest.mark.parametrize("recipe", ["lab-tp2", "lab-tp4"])
def test_both_lab_recipes_render_for_their_cluster(tmp_path: Path, recipe: str) -> None:
    nodes = int(recipe[-1])
    done = render(cluster_file(tmp_path, nodes=nodes, recipe=recipe))
    assert done.returncode == 0, done.stdout + done.stderr
    assert flat(done.stdout).count("--node-rank") == nodes


# ------------------------------------------------------------ bad recipes (issue 17)

def recipes_copy(tmp_path: Path, name: str = "lab-tp2", change: tuple[str, str] = ("", "")) -> Path:
    """A recipes folder beside the test holding recipes/NAME.yml, lab-tp2's text with CHANGE made, and its patches."""
    folder = tmp_path / "recipes"
    shutil.copytree(ROOT / "recipes" / "patches", folder / "patches")
    text = (ROOT / "recipes" / "lab-tp2.yml").read_text(encoding="utf-8").replace("name: lab-tp2", f"name: {name}")
    assert change[0] in text
    (folder / f"{name}.yml").write_text(text.replace(*change), encoding="utf-8")
    return folder


def test_a_recipe_that_is_not_yaml_is_refused_naming_its_file_and_line(tmp_path: Path) -> None:
    folder = recipes_copy(tmp_path, "zz-broken", ("image_from: lab_engine_image", "image: [unclosed"))
    done = render(cluster_file(tmp_path, recipe="zz-broken"), "-e", f"recipe_dir={folder}")
    out = flat(done.stdout)
    assert done.returncode != 0
    assert (f"recipe zz-broken ({folder}/zz-broken.yml, line 10, column 8): the file is not valid YAML: "
            'expected "," or "]", but got ":" while parsing a flow sequence (the line reads "image: [unclosed"); '
            "close the [ opened there with ], or quote the value if the [ belongs to it.") in out
    assert "from_yaml" not in out and "Finalization" not in out


def test_a_secret_in_a_recipe_env_is_refused_and_never_printed(tmp_path: Path) -> None:
    folder = recipes_copy(tmp_path, change=("env:\n", "env:\n  HF_TOKEN: hf-token-not-shown\n"))
    done = render(cluster_file(tmp_path), "-e", f"recipe_dir={folder}")
    out = flat(done.stdout)
    assert done.returncode != 0
    assert (f"recipe lab-tp2 ({folder}/lab-tp2.yml, line 41): env.HF_TOKEN is ********; its name says it holds a "
            "secret") in out
    assert "Ansible Vault as weights_hf_token" in out
    assert "hf-token-not-shown" not in done.stdout + done.stderr


def test_render_masks_secret_looking_values(tmp_path: Path) -> None:
    # A secret can still reach what render.yml prints: an engine flag, or the inventory's fabric_env_extra.
    folder = recipes_copy(tmp_path, change=("engine_args:\n", "engine_args:\n  api-key: sk-key-not-shown\n"))
    inventory = cluster_file(tmp_path)
    with inventory.open("a", encoding="utf-8") as handle:
        handle.write("  fabric_env_extra: {NCCL_DEBUG: INFO, UCX_SECRET: fabric-secret-not-shown}\n")
    done = render(inventory, "-e", f"recipe_dir={folder}")
    out = flat(done.stdout)
    assert done.returncode == 0, done.stdout + done.stderr
    assert len(re.findall(r"--api-key '*\*{8}'* --max-model-len", out)) == 2  # quoted, then quoted again by YAML
    assert out.count("UCX_SECRET=******** ") == 2 and "NCCL_DEBUG=INFO" in out
    assert "not-shown" not in done.stdout + done.stderr
