"""tools/chaos.py: the draw of each round and every invariant, each made to fail on purpose (no lab)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.scripts import ROOT, load_script

chaos = load_script("tools/chaos.py", "sparkserve_chaos")
sys.path.insert(0, str(ROOT / "collections"))
from ansible_collections.sparkserve.deploy.plugins.plugin_utils import controller_run  # noqa: E402


def test_a_round_is_drawn_from_the_seed_alone() -> None:
    assert chaos.draw(7, 3) == chaos.draw(7, 3)
    rounds = [chaos.draw(seed, number) for seed in range(40) for number in range(1, 11)]
    assert {r.operation for r in rounds} == set(chaos.OPERATIONS)
    assert {r.fault for r in rounds} == set(chaos.FAULTS)
    for r in rounds:
        assert (r.moment, r.pattern) in chaos.MOMENTS[r.operation]
        assert r.node in chaos.PLACED[r.deployment] or r.fault not in ("kill-rank", "sigstop-engine")
        # Killing the controller's run needs a run.
        assert not (r.operation == "serving" and r.fault in chaos.NEEDS_RUN)
    assert chaos.draw(7, 3).replay() == "make chaos SEED=7 ROUND=3"


def test_every_moment_is_a_line_the_operation_prints() -> None:
    """Each pattern names a play or task that exists, so a moment is an event of the run, not a time."""
    names = []
    for path in [ROOT / "site.yml", *ROOT.glob("playbooks/*.yml"), *ROOT.glob("roles/*/tasks/*.yml")]:
        names += [line.split("name:", 1)[1].strip() for line in path.read_text(encoding="utf-8").splitlines()
                  if line.lstrip().startswith("- name:")]
    for operation, moments in chaos.MOMENTS.items():
        for moment, pattern in moments:
            if not pattern:
                continue
            body = re.sub(r"^\^(PLAY|TASK) \\\[(\w+ : )?", "", pattern)
            assert any(re.match(body, name) for name in names), f"{operation} at {moment}: {pattern}"


def rank(deployment: str, node: str, fingerprint: str, running: bool = True) -> Any:
    return chaos.Rank(deployment, node, f"{deployment}-rank-{node}", running, fingerprint)


def test_two_fingerprints_in_one_deployment_fail_the_invariant() -> None:
    healthy = [rank("lab-tp2", "spark-1", "a" * 64), rank("lab-tp2", "spark-2", "a" * 64),
               rank("lab-tp1", "spark-1", "b" * 64), rank("lab-tp2", "spark-2", "c" * 64, running=False)]
    assert chaos.mixed_fingerprints(healthy) == []
    planted = healthy + [rank("lab-tp2", "spark-3", "c" * 64)]
    [problem] = chaos.mixed_fingerprints(planted)
    assert problem.startswith("lab-tp2 runs ranks of 2 fingerprints") and "cccccccccccc" in problem


def test_a_planted_stale_lock_fails_the_invariant() -> None:
    here = controller_run.run_identity(os.getpid())
    gone = subprocess.Popen(["true"])
    gone.wait()
    stale = dict(here, pid=gone.pid, pid_start=1)

    def judge(run: Any) -> tuple[str, str]:
        return controller_run.judge_run(run, here)

    assert chaos.stale_locks({"spark-1:/run/sparkserve/locks/lab-tp2.lock": {"owner": "me", "run": here}}, judge) == []
    [problem] = chaos.stale_locks({"spark-1:/run/sparkserve/locks/lab-tp2.lock": {"owner": "sparkserve up",
                                                                                  "run": stale}}, judge)
    assert "lab-tp2.lock is held by sparkserve up, which is gone" in problem
    # A lock of another controller cannot be judged here: not this invariant's to fail.
    assert chaos.stale_locks({"x": {"run": dict(stale, controller="elsewhere")}}, judge) == []


def test_a_planted_token_in_a_log_fails_the_invariant() -> None:
    token = "hf_" + "q" * 30
    texts = [("spark-1: journal", "rank 0 ready\n"), ("artifacts/run/stdout", f"Authorization: Bearer {token}\n")]
    [problem] = chaos.leaked_secrets(texts, {"the hub token": token, "a short one": "short"})
    assert problem == "artifacts/run/stdout holds the hub token" and token[:3] not in problem
    assert chaos.leaked_secrets(texts[:1], {"the hub token": token}) == []


def test_a_repository_that_does_not_verify_fails_the_invariant() -> None:
    whole = ("spark-1", "/var/lib/sparkserve/models/m/r1", {"missing": [], "corrupt": []})
    incomplete = ("spark-2", "/var/lib/sparkserve/models/m/r2", {"incomplete": True, "missing": ["a"]})
    corrupt = ("spark-2", "/var/lib/sparkserve/models/m/r1", {"missing": [], "corrupt": [{"path": "w.bin"}]})
    assert chaos.unverified_repositories([whole, incomplete]) == []
    assert chaos.unverified_repositories([whole, corrupt]) == [
        "spark-2:/var/lib/sparkserve/models/m/r1 does not verify (0 missing, 1 corrupt)"]


def test_a_deployment_neither_serving_nor_in_a_clear_state_fails_the_invariant() -> None:
    ranks = [rank("lab-tp2", "spark-1", "a"), rank("lab-tp1", "spark-1", "b", running=False)]
    assert chaos.unclear_deployments({"lab-tp2": True, "lab-tp1": False}, {"lab-tp1": "needs attention: x"},
                                     ranks) == []
    assert chaos.unclear_deployments({"lab-tp2": True, "lab-tp1": False}, {}, ranks, stopped=["lab-tp1"]) == []
    [problem] = chaos.unclear_deployments({"lab-tp2": False, "lab-tp1": True}, {"lab-tp2": "healing"}, ranks)
    assert problem == "lab-tp2 does not serve and holds no clear state (supervisor: healing)"
    [problem] = chaos.unclear_deployments({"lab-tp2": False}, {"lab-tp2": "needs reboot: spark-2"}, ranks)
    assert problem.startswith("lab-tp2 holds needs reboot: spark-2 but ranks still run: lab-tp2-rank-spark-1")
    # A supervisor not running (a head rebooted without start_on_boot) holds a deployment stopped; a failed one
    # does not, and neither holds one whose ranks still run.
    stale = "not running (inactive); its last state: watching"
    assert chaos.unclear_deployments({"lab-tp1": False}, {"lab-tp1": stale}, ranks) == []
    [problem] = chaos.unclear_deployments({"lab-tp1": False}, {"lab-tp1": "not running (failed); x"}, ranks)
    assert problem.startswith("lab-tp1 does not serve and holds no clear state")
    [problem] = chaos.unclear_deployments({"lab-tp2": False}, {"lab-tp2": stale}, ranks)
    assert problem.startswith("lab-tp2 holds not running (inactive)") and "but ranks still run" in problem


def test_an_answer_from_a_dead_rank_fails_the_invariant() -> None:
    dead = {"lab-tp2": [(100.0, 160.0)]}
    fine = [(99.0, "lab-tp2", 200), (101.0, "lab-tp2", 200), (130.0, "lab-tp2", 502), (130.0, "lab-tp1", 200),
            (170.0, "lab-tp2", 200)]
    assert chaos.answers_from_dead(fine, dead) == []
    [problem] = chaos.answers_from_dead(fine + [(140.0, "lab-tp2", 200), (150.0, "lab-tp2", 200)], dead)
    assert problem == ("the gateway answered lab-tp2 with 200 2 times while a rank was dead "
                       "(from +40.0s to +50.0s of a window of 60.0s)")


def test_a_site_yml_that_does_not_converge_or_changes_again_fails_the_invariant() -> None:
    assert chaos.not_converged((0, {"spark-1": 3}), (0, {"spark-1": 0, "spark-2": 0})) == []
    assert chaos.not_converged((2, {}), (0, {"spark-1": 1})) == [
        "site.yml after the round failed (exit 2)", "the second site.yml changed spark-1: 1"]


def test_plan_prints_the_rounds_and_touches_nothing(capsys: Any, tmp_path: Path) -> None:
    assert chaos.main(["--rounds", "3", "--seed", "11", "--plan"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 and lines[0].split()[0] == "1"
    assert chaos.main(["--seed", "11", "--round", "2", "--plan"]) == 0
    assert capsys.readouterr().out.splitlines() == [lines[1]]


def test_a_failed_round_says_why_its_run_stopped() -> None:
    lines = ["PLAY RECAP ****\n", "The run stopped on spark-1, a first reason\n",
             'The run stopped on spark-2, at "image : Pull the image":\n',
             "  the registry at sparkserve-lab-registry:5000 did not answer\n"]
    assert chaos.stop_reason(lines) == 'The run stopped on spark-2, at "image : Pull the image": the registry at ' \
                                       "sparkserve-lab-registry:5000 did not answer"
    assert chaos.stop_reason(["fatal: no recap\n"]) == "the run printed no reason"
