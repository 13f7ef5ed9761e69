"""The stop_reason callback: a failed run ends with why it stopped, after the play recap."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PLAY = """\
    - name: A run on the controller
      hosts: localhost
      gather_facts: false
      tasks:
        - name: A failure a block rescues
          block:
            - name: Fail inside the block
              ansible.builtin.fail:
                msg: rescued, not the reason
          rescue:
            - name: Note the rescue
              ansible.builtin.debug:
                msg: rescued
        - name: A failure that is ignored
          ansible.builtin.fail:
            msg: ignored, not the reason
          ignore_errors: true
        - name: The failure that stops the run
          ansible.builtin.fail:
            msg: "recipe t (recipes/t.yml, line 3): parallel.tensor is 3; use a power of two"
          when: stop | bool
    """


def run(tmp_path: Path, stop: bool) -> subprocess.CompletedProcess[str]:
    playbook = tmp_path / "play.yml"
    playbook.write_text(textwrap.dedent(PLAY), encoding="utf-8")
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0",
               ANSIBLE_CACHE_PLUGIN="memory", ANSIBLE_LOCAL_TEMP=str(tmp_path / "ansible-tmp"))
    command = [str(Path(sys.executable).parent / "ansible-playbook"), str(playbook), "-e", f"stop={stop}"]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False)


def test_the_reason_a_run_stopped_is_the_last_thing_shown(tmp_path: Path) -> None:
    done = run(tmp_path, True)
    assert done.returncode == 2
    # The recap is on stdout, the reason after it on stderr: the reason is what the screen ends with.
    assert done.stdout.rstrip().splitlines()[-1].startswith("localhost")
    assert done.stderr.rstrip().endswith(
        'The run stopped on localhost, at "The failure that stops the run":\n'
        "recipe t (recipes/t.yml, line 3): parallel.tensor is 3; use a power of two")
    assert "rescued, not the reason" not in done.stderr.split("The run stopped")[-1]
    assert done.stderr.count("The run stopped") == 1


def test_a_run_that_succeeded_ends_with_its_recap(tmp_path: Path) -> None:
    done = run(tmp_path, False)
    assert done.returncode == 0, done.stdout
    assert "The run stopped" not in done.stdout + done.stderr
