#!/usr/bin/env python3
"""Chaos on the lab: a random operation, a fault at a moment it reaches, then the invariants, round after round.

    tools/chaos.py --rounds N --seed S [--round K] [--report FILE]      (make chaos ROUNDS=N SEED=S)

Brings up (or keeps) the lab with the gateway and two deployments (lab-tp2 over both nodes, lab-tp1 on
spark-1), serving. Each round draws from the seed an operation (nothing while serving, site.yml with a changed
recipe, an upgrade to a new model commit and image digest, a rollback, a stop), a fault (a rank killed or
stopped with SIGSTOP, a node's container killed, a node's dockerd restarted, a node's memory under the guard's
floor, a changed GID index, a fabric twin down, the hub or the registry stopped, the controller's run killed
with SIGKILL, a node's models disk filled to its last byte) and the moment to strike: a line of the
operation's own output (a play or task starting), never a sleep; while serving, the first completion answered
through the gateway. Then it heals what the fault broke outside the software (starts the node again, brings
the link up, ...), and checks, within the fault's bound, that every deployment serves or holds a clear state
with every rank stopped, and that the gateway never answered from a dead rank; a site.yml must then converge
and a second change nothing; after it no lock is held by a run that is gone, no deployment runs ranks of two
fingerprints, every repository on disk verifies, and no token or key is in any log, journal, artifact or
output.

One line per round (seed, operation, fault, moment, outcome, time back to serving) and a summary; a
failing round prints the command that replays it alone (--round K with the same seed). Not part of make
test: one round takes minutes.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import yaml

ROOT = Path(__file__).resolve().parents[1]
LAB = os.environ.get("SPARKSERVE_LAB_NAME", "sparkserve-lab")
STATE = ROOT / ".lab"
INVENTORY = ROOT / "inventory" / "lab"
# The lab of the rounds: two deployments behind the gateway.
DEPLOYMENTS = [{"recipe": "lab-tp2", "priority": 10}, {"recipe": "lab-tp1", "nodes": ["spark-1"]}]
NODES = ("spark-1", "spark-2")
# Where each deployment runs and the model it serves (the lab recipes).
PLACED = {"lab-tp2": ("spark-1", "spark-2"), "lab-tp1": ("spark-1",)}
SERVED = {"lab-tp2": "tiny-model", "lab-tp1": "tiny-model-1"}
TWIN = "enp1s0f1np1"
MODELS = "/var/lib/sparkserve/models"
OPERATION_TIMEOUT_S = 900
# Every ansible run of the rounds reads the project's configuration, wherever chaos is started from.
ENV = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0")

# -- the draw ------------------------------------------------------------------------------------------------

# Each operation: the moments it reaches, as (name, pattern of its output).
MOMENTS: dict[str, list[tuple[str, str]]] = {
    "serving": [("a completion answered", "")],
    "up-changed": [("the image stage", r"^PLAY \[The recipe's image"),
                   ("the weights stage", r"^PLAY \[(What every Spark holds|Weights on every Spark)"),
                   ("the stop before the start", r"^TASK \[engine : Stop every rank of the deployment first"),
                   ("a rank's start", r"^TASK \[engine : Start in the background the container of rank"),
                   ("the readiness wait", r"^TASK \[engine : Wait until the deployment serves"),
                   ("the supervisor stage", r"^PLAY \[Supervise the deployment")],
    "upgrade": [("the staging", r"^PLAY \[The recipe's image"),
                ("the weights' transfer", r"^PLAY \[Weights on every Spark"),
                ("the last completion of the old release", r"^TASK \[engine : Ask the release being replaced"),
                ("a rank's start", r"^TASK \[engine : Start in the background the container of rank"),
                ("the readiness wait", r"^TASK \[engine : Wait until the deployment serves")],
    "rollback": [("the stop before the start", r"^TASK \[engine : Stop every rank of the deployment first"),
                 ("the readiness wait", r"^TASK \[engine : Wait until the deployment serves")],
    "stop": [("the supervisor's stop", r"^TASK \[Stop the supervisor first"),
             ("the ranks' stop", r"^TASK \[engine : Stop this node's ranks of the deployment")],
}
OPERATIONS = tuple(MOMENTS)
# Each fault: the seconds within which every deployment must serve again or hold a clear state, once the
# fault is healed (the supervisor's heal, a relaunch's memory wait).
BOUNDS_S = {"kill-rank": 240, "sigstop-engine": 300, "kill-node": 300, "restart-dockerd": 300,
            "memory-drop": 300, "gid-change": 240, "link-down": 240, "hub-stop": 240, "registry-stop": 240,
            "kill-controller": 240, "disk-full": 240}
FAULTS = tuple(BOUNDS_S)
# How long a rank fault struck during a run waits for a rank of the deployment to run on its node.
RANK_WAIT_S = 60
# A fault that needs a run of the controller to strike.
NEEDS_RUN = {"kill-controller"}
# Faults of the world around the software (a node, a link, memory, the hub, the registry): put back by the
# round as a person would, before the software is asked to be serving again. The others it must heal itself;
# the round only cleans up after (a SIGSTOP left on a container the software did not restart, the GID).
HEALED_FROM_OUTSIDE = {"kill-node", "memory-drop", "link-down", "hub-stop", "registry-stop", "disk-full"}
# A full models disk: a real file system (a tmpfs holding a copy of what the disk held, a few MiB in the lab)
# mounted over the models folder and filled to its last byte. The disk it hides stays reachable at DISK_UNDER;
# the heal makes it hold what the full disk held (less the filler), then takes the tmpfs away.
DISK_UNDER = "/run/sparkserve-chaos/models-under"
DISK_FILL = f"""set -e
mkdir -p {DISK_UNDER}
mount --bind {MODELS} {DISK_UNDER}
mount -t tmpfs -o size=$(( $(du -sk {DISK_UNDER} | cut -f1) + 4096 ))k sparkserve-chaos-full {MODELS}
cp -a {DISK_UNDER}/. {MODELS}/
dd if=/dev/zero of={MODELS}/.chaos-fill bs=64k 2>/dev/null || true
df -k --output=avail {MODELS} | tail -1"""
DISK_FREE = f"""set -e
if mountpoint -q {DISK_UNDER}; then
  rm -f {MODELS}/.chaos-fill
  rsync -a --delete {MODELS}/ {DISK_UNDER}/
  umount --lazy {MODELS}
  umount --lazy {DISK_UNDER}
fi"""


@dataclass(frozen=True)
class Round:
    seed: int
    number: int
    operation: str
    deployment: str
    fault: str
    node: str
    moment: str
    pattern: str

    def replay(self) -> str:
        return f"make chaos SEED={self.seed} ROUND={self.number}"


def draw(seed: int, number: int) -> Round:
    """Round NUMBER of SEED: the same draw on every machine and every run."""
    rng = random.Random(f"sparkserve-chaos:{seed}:{number}")
    operation = rng.choice(OPERATIONS)
    faults = [f for f in FAULTS if operation != "serving" or f not in NEEDS_RUN]
    fault = rng.choice(faults)
    deployment = rng.choice(sorted(PLACED))
    node = rng.choice(PLACED[deployment]) if fault in ("kill-rank", "sigstop-engine") else rng.choice(NODES)
    moment, pattern = rng.choice(MOMENTS[operation])
    return Round(seed, number, operation, deployment, fault, node, moment, pattern)


# -- the invariants: each takes what was read and returns its problems (none when it holds) -----------------

@dataclass
class Rank:
    deployment: str
    node: str
    container: str
    running: bool
    fingerprint: str


def mixed_fingerprints(ranks: Iterable[Rank]) -> list[str]:
    """No deployment runs ranks of two fingerprints."""
    seen: dict[str, dict[str, list[str]]] = {}
    for rank in ranks:
        if rank.running:
            where = seen.setdefault(rank.deployment, {}).setdefault(rank.fingerprint, [])
            where.append(f"{rank.container}@{rank.node}")
    return [f"{name} runs ranks of {len(prints)} fingerprints: "
            + "; ".join(f"{fp[:12]} ({', '.join(sorted(where))})" for fp, where in sorted(prints.items()))
            for name, prints in sorted(seen.items()) if len(prints) > 1]


def stale_locks(locks: Mapping[str, Any], judge: Callable[[Any], tuple[str, str]]) -> list[str]:
    """No lock is held by a run that is gone (judge: controller_run.judge_run of the lock's run)."""
    problems = []
    for where, holder in sorted(locks.items()):
        run = holder.get("run") if isinstance(holder, dict) else None
        state, why = judge(run)
        if state == "gone":
            problems.append(f"{where} is held by {holder.get('owner', 'a run')}, which is gone ({why})")
    return problems


def leaked_secrets(texts: Iterable[tuple[str, str]], secrets: Mapping[str, str]) -> list[str]:
    """No token or key in any log, journal, artifact or output (each text named by where it was read; each
    secret by what it is, never by any part of it)."""
    wanted = {name: value for name, value in secrets.items() if len(value) >= 8}
    return [f"{where} holds {name}" for where, text in texts for name, value in wanted.items() if value in text]


def unverified_repositories(results: Iterable[tuple[str, str, dict[str, Any]]]) -> list[str]:
    """Every repository on disk verifies (nothing missing, nothing corrupt) or is marked incomplete."""
    problems = []
    for node, path, result in results:
        if result.get("incomplete"):
            continue
        missing, corrupt = result.get("missing") or [], result.get("corrupt") or []
        if result.get("failed") or missing or corrupt:
            problems.append(f"{node}:{path} does not verify ({len(missing)} missing, {len(corrupt)} corrupt"
                            f"{'; ' + str(result.get('msg')) if result.get('failed') else ''})")
    return problems


def unclear_deployments(serving: Mapping[str, bool], states: Mapping[str, str], ranks: Iterable[Rank],
                        stopped: Iterable[str] = ()) -> list[str]:
    """Every deployment serves, or holds a clear state (needs attention, needs reboot, failed with its reason,
    stopped by the operator, or by a supervisor that is not running) with every rank stopped."""
    running: dict[str, list[str]] = {}
    for rank in ranks:
        if rank.running:
            running.setdefault(rank.deployment, []).append(f"{rank.container}@{rank.node}")
    problems = []
    for name, answers in sorted(serving.items()):
        if answers:
            continue
        state = states.get(name, "")
        # A supervisor that is not running (inactive: stopped, or not started on this boot; not failed) holds
        # the deployment stopped, a clear state as long as no rank runs.
        clear = name in stopped or state.startswith(("needs attention", "needs reboot", "failed",
                                                     "not running (inactive)"))
        if not clear:
            problems.append(f"{name} does not serve and holds no clear state (supervisor: {state or 'none'})")
        elif running.get(name):
            still = ", ".join(sorted(running[name]))
            problems.append(f"{name} holds {state or 'stopped'} but ranks still run: {still}")
    return problems


def answers_from_dead(answers: Iterable[tuple[float, str, int]], dead: Mapping[str, list[tuple[float, float]]],
                      grace_s: float = 2.0) -> list[str]:
    """The gateway never answers from a dead rank: no 200 for a deployment while one of its ranks was dead
    (DEAD: per deployment, the windows [from, to] in which a rank was seen dead), past GRACE_S of requests in
    flight when it died. One problem per window, with how many 200s it held and when the last came."""
    problems = []
    for name, windows in sorted(dead.items()):
        for start, end in windows:
            late = [when - start for when, asked, status in answers
                    if asked == name and status == 200 and start + grace_s <= when <= end]
            if late:
                problems.append(f"the gateway answered {name} with 200 {len(late)} times while a rank was dead "
                                f"(from +{min(late):.1f}s to +{max(late):.1f}s of a window of {end - start:.1f}s)")
    return problems


def not_converged(first: tuple[int, Mapping[str, int]], second: tuple[int, Mapping[str, int]]) -> list[str]:
    """A following site.yml converges, then changes nothing (each: exit status, changed per host)."""
    problems = []
    if first[0] != 0:
        problems.append(f"site.yml after the round failed (exit {first[0]})")
    if second[0] != 0:
        problems.append(f"the second site.yml failed (exit {second[0]})")
    changed = {host: n for host, n in second[1].items() if n}
    if changed:
        problems.append("the second site.yml changed " + ", ".join(f"{h}: {n}" for h, n in sorted(changed.items())))
    return problems


# -- reading the lab ----------------------------------------------------------------------------------------

def sh(argv: Sequence[str], timeout: float = 120, check: bool = False,
       stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False, input=stdin,
                          cwd=ROOT, env=ENV)
    if check and done.returncode != 0:
        raise RuntimeError(f"{shlex.join(argv)} exited {done.returncode}: {done.stderr.strip()[-500:]}")
    return done


def on_node(node: str, script: str, timeout: float = 120, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return sh(["docker", "exec", "-i", f"{LAB}-{node}", "sh", "-c", script], timeout=timeout, stdin=stdin)


def node_up(node: str) -> bool:
    done = sh(["docker", "inspect", "-f", "{{.State.Running}}", f"{LAB}-{node}"])
    return done.stdout.strip() == "true"


def read_ranks() -> list[Rank]:
    ranks = []
    fmt = ('{{.Names}}\t{{.State}}\t{{.Label "sparkserve.deployment"}}\t{{.Label "sparkserve.fingerprint"}}'
           '\t{{.Label "sparkserve.rank"}}')
    for node in NODES:
        if not node_up(node):
            continue
        done = on_node(node, f"docker ps -a --filter label=sparkserve.fingerprint --format '{fmt}'", timeout=60)
        for line in done.stdout.splitlines():
            parts = line.split("\t")
            if len(parts) == 5:
                name, state, deployment, fingerprint, _rank = parts
                ranks.append(Rank(deployment, node, name, state == "running", fingerprint))
    return ranks


def stopped_processes(node: str) -> set[str]:
    """Rank containers on NODE whose main process is stopped (SIGSTOP): dead though Docker says running."""
    done = on_node(node, "for c in $(docker ps -q --filter label=sparkserve.fingerprint); do "
                         "pid=$(docker inspect -f '{{.State.Pid}}' $c); "
                         "st=$(awk '{print $3}' /proc/$pid/stat 2>/dev/null); "
                         "[ \"$st\" = T ] && docker inspect -f '{{.Name}}' $c; done", timeout=60)
    return {line.strip().lstrip("/") for line in done.stdout.splitlines() if line.strip()}


def supervisor_states() -> dict[str, str]:
    """Each deployment's supervisor state (its DEPLOYMENT.state.json on the head), as `sparkserve status` reads
    it: the file's state while the supervisor's unit is active, else ``not running (UNIT STATE)`` and the last
    state it wrote (after a stop, or a reboot of a head whose recipe does not start it on boot)."""
    program = ("import glob,json,subprocess\n"
               "states = {}\n"
               "for path in glob.glob('/var/lib/sparkserve/supervisor/*.state.json'):\n"
               "    try:\n"
               "        record = json.load(open(path))\n"
               "    except ValueError:\n"
               "        continue\n"
               "    name = record.get('deployment', '')\n"
               "    unit = subprocess.run(['systemctl', 'is-active', 'sparkserve-supervisor@%s.service' % name],\n"
               "                          capture_output=True, text=True).stdout.strip()\n"
               "    last = record.get('state', '')\n"
               "    gone = 'not running (%s); its last state: %s' % (unit, last)\n"
               "    states[name] = last if unit == 'active' else gone\n"
               "print(json.dumps(states))\n")
    done = on_node("spark-1", "python3 -", stdin=program) if node_up("spark-1") else None
    try:
        return json.loads(done.stdout) if done is not None and done.returncode == 0 else {}
    except json.JSONDecodeError:
        return {}


def read_locks() -> dict[str, Any]:
    locks: dict[str, Any] = {}
    for node in NODES:
        if not node_up(node):
            continue
        done = on_node(node, "for f in /run/sparkserve/locks/*.lock; do [ -f \"$f\" ] && "
                             "printf '%s\\t' \"$f\" && tr -d '\\n' < \"$f\" && echo; done")
        for line in done.stdout.splitlines():
            path, _, text = line.partition("\t")
            try:
                locks[f"{node}:{path}"] = json.loads(text)
            except json.JSONDecodeError:
                locks[f"{node}:{path}"] = {"owner": "an unreadable lock", "run": None}
    return locks


def verify_repositories() -> list[tuple[str, str, dict[str, Any]]]:
    """Each node's repositories, each checked against its manifest by the weights stage's own module."""
    with tempfile.TemporaryDirectory(prefix="sparkserve-chaos-repos-") as out:
        done = sh(ansible("tools/chaos-repositories.yml", "-e", f"chaos_results_dir={out}"), timeout=600)
        results: list[tuple[str, str, dict[str, Any]]] = []
        for path in sorted(Path(out).glob("*.json")):
            results += repositories_of(path.stem, json.loads(path.read_text(encoding="utf-8")))
        if done.returncode != 0:
            results.append(("controller", "(the check)", {"failed": True, "msg": done.stdout[-300:]}))
    return results


def repositories_of(node: str, found: Mapping[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """What tools/chaos-repositories.yml wrote of a node: each checked repository, then each revision folder
    (MODELS/ORG/REPO/REVISION) without a manifest, which is incomplete."""
    checked = {str(Path(r["item"]["path"]).parent): r for r in found.get("checked", [])}
    revisions = [f for f in found.get("folders", []) if len(Path(f).relative_to(MODELS).parts) == 3]
    return ([(node, folder, result) for folder, result in sorted(checked.items())]
            + [(node, folder, {"incomplete": True}) for folder in sorted(revisions) if folder not in checked])


def secrets() -> dict[str, str]:
    """The lab's secrets, by what they are: the gateway's keys and the hub's token."""
    files = {f"the gateway key in {f.name}": f for f in STATE.glob("gateway-key*")}
    files["the hub token"] = STATE / "hub-token"
    return {name: f.read_text(encoding="utf-8").strip() for name, f in files.items() if f.is_file()}


def texts_to_search(since: float, outputs: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """The round's outputs, the controller's artifacts and runner folders, each node's journal and logs."""
    texts = list(outputs)
    for folder in (ROOT / "artifacts", ROOT / ".cache" / "runner"):
        for path in folder.rglob("*") if folder.is_dir() else []:
            if path.is_file() and path.stat().st_mtime >= since - 1 and path.stat().st_size < 20_000_000:
                texts.append((str(path.relative_to(ROOT)), path.read_text(encoding="utf-8", errors="replace")))
    for node in NODES:
        if not node_up(node):
            continue
        journal = on_node(node, f"journalctl --no-pager -o cat --since=@{int(since)}", timeout=120)
        texts.append((f"{node}: journal", journal.stdout))
        logs = on_node(node, "find /var/log /var/lib/sparkserve -type f -size -20M "
                             "-not -path '/var/lib/sparkserve/models/*' -newermt @" + str(int(since)) +
                             " -exec grep -lI . {} + 2>/dev/null | while read f; do echo \"== $f\"; cat \"$f\"; done",
                       timeout=120)
        for chunk in ("\n" + logs.stdout).split("\n== ")[1:]:
            name, _, body = chunk.partition("\n")
            texts.append((f"{node}:{name}", body))
    return texts


# -- the gateway and the ranks, watched during the round ------------------------------------------------------

@dataclass
class Watch:
    """Completions through the gateway, and the windows in which a rank of each deployment was dead."""

    url: str
    key: str
    answers: list[tuple[float, str, int]] = field(default_factory=list)
    dead: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    stop: threading.Event = field(default_factory=threading.Event)
    first_answer: threading.Event = field(default_factory=threading.Event)
    # The deployments with a rank dead now (since when), and when the ranks were last read.
    dead_now: dict[str, float] = field(default_factory=dict)
    sampled_at: float = 0.0

    def ask(self, deployment: str, timeout: float = 10) -> int:
        body = json.dumps({"model": SERVED[deployment], "prompt": "chaos", "max_tokens": 2}).encode()
        request = urllib.request.Request(f"{self.url}/v1/completions", data=body, method="POST", headers={
            "Content-Type": "application/json", "Authorization": f"Bearer {self.key}"})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as answer:
                return int(answer.status)
        except urllib.error.HTTPError as err:
            return int(err.code)
        except (OSError, ValueError):
            return 0

    def client(self) -> None:
        while not self.stop.is_set():
            for name in SERVED:
                status = self.ask(name)
                self.answers.append((time.time(), name, status))
                if status == 200:
                    self.first_answer.set()
            self.stop.wait(0.5)

    def ranks(self) -> None:
        opened = self.dead_now
        while not self.stop.is_set():
            now = time.time()
            try:
                ranks = read_ranks()
                frozen = set().union(*(stopped_processes(n) for n in NODES if node_up(n)))
            except (RuntimeError, subprocess.TimeoutExpired):
                self.stop.wait(1)
                continue
            present = {(r.deployment, r.node) for r in ranks if r.running and r.container not in frozen}
            for name, nodes in PLACED.items():
                dead = any((name, node) not in present for node in nodes)
                if dead and name not in opened:
                    opened[name] = now
                elif not dead and name in opened:
                    self.dead.setdefault(name, []).append((opened.pop(name), now))
            self.sampled_at = now
            self.stop.wait(1)
        for name, start in opened.items():
            self.dead.setdefault(name, []).append((start, time.time()))

    def __enter__(self) -> Watch:
        self.threads = [threading.Thread(target=self.client, daemon=True),
                        threading.Thread(target=self.ranks, daemon=True)]
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=60)


# -- operations, faults, heals --------------------------------------------------------------------------------

def ansible(playbook: str, *args: str) -> list[str]:
    return [str(Path(sys.executable).with_name("ansible-playbook")), "-i", str(INVENTORY), str(ROOT / playbook), *args]


def lab_settings() -> dict[str, Any]:
    """spark-1's variables as the lab's inventory gives them (its address, the gateway's port, the engine image,
    the model's commit, the registry)."""
    done = sh([str(Path(sys.executable).with_name("ansible-inventory")), "-i", str(INVENTORY), "--list"], check=True)
    hostvars = json.loads(done.stdout)["_meta"]["hostvars"]
    return dict(next(v for name, v in hostvars.items() if name == "spark-1" or name.endswith("@spark-1")))


def new_model_revision(round_: Round, repo: str) -> str:
    """A new commit of the lab's model on the hub double, of its own bytes: what an upgrade downloads and relays."""
    revision = hashlib.sha1(f"{repo}@chaos-{round_.seed}-{round_.number}".encode()).hexdigest()
    folder = STATE / "hub" / repo / revision
    if not (folder / "config.json").exists():
        sh([sys.executable, str(ROOT / "lab/engine/make_tiny_model.py"), str(folder), "--seed", str(round_.number)],
           check=True)
    return revision


def new_engine_image(round_: Round, workdir: Path, settings: Mapping[str, Any]) -> str:
    """The lab's engine image with one more layer (8 MiB of the round's own), pushed to the lab's registry: a new
    digest, which an upgrade pulls once and relays over the fabric. The nodes' name for it."""
    name, digest = str(settings["lab_engine_image"]).split("@")
    local = str(settings["lab_registry"]["url"]).split("://", 1)[1] + "/" + name.split("/", 1)[1]
    context = workdir / f"image-{round_.number}"
    context.mkdir(exist_ok=True)
    (context / "round.bin").write_bytes(random.Random(f"{round_.seed}:{round_.number}").randbytes(8 << 20))
    (context / "Dockerfile").write_text(f"FROM {local}@{digest}\nCOPY round.bin /opt/sparkserve-chaos/round.bin\n",
                                        encoding="utf-8")
    tag = f"{local}:chaos-{round_.seed}-{round_.number}"
    sh(["docker", "build", "-q", "-t", tag, str(context)], timeout=600, check=True)
    pushed = sh(["docker", "push", tag], timeout=600, check=True)
    found = re.search(r"digest: (sha256:[0-9a-f]{64})", pushed.stdout)
    if not found:
        raise RuntimeError(f"docker push {tag} printed no digest: {pushed.stdout[-300:]}")
    return f"{name}@{found.group(1)}"


def changed_recipe(workdir: Path, round_: Round, transfer: bool = False) -> list[str]:
    """The deployment's recipe with another max-model-len, as a copy named for the round, and the arguments that
    make the run use it for that deployment alone. With transfer (an upgrade), a new model commit and a new image
    digest too, so that the run downloads, pulls and relays them: the moments the hub's and the registry's faults
    strike in the middle of."""
    recipes = workdir / "recipes"
    if not recipes.exists():
        subprocess.run(["cp", "-r", str(ROOT / "recipes"), str(recipes)], check=True)
    deployment = round_.deployment
    recipe = yaml.safe_load((ROOT / "recipes" / f"{deployment}.yml").read_text(encoding="utf-8"))
    name = f"{deployment}-chaos{round_.number}"
    recipe["name"] = name
    recipe.setdefault("engine_args", {})["max-model-len"] = 1024 + 128 * (round_.number % 4 + 1)
    if transfer:
        settings = lab_settings()
        recipe.pop("image_from", None)
        recipe["image"] = new_engine_image(round_, workdir, settings)
        recipe["model"].pop("revision_from", None)
        recipe["model"]["revision"] = new_model_revision(round_, recipe["model"]["repo"])
    (recipes / f"{name}.yml").write_text(yaml.safe_dump(recipe, sort_keys=False), encoding="utf-8")
    return ["--limit", f"deployment_{deployment.replace('-', '_')}:localhost", "-e", f"sparkserve_recipe={name}",
            "-e", f"recipe_dir={recipes}", "-e", f"sparkserve_deployment={deployment}"]


def operation_argv(round_: Round, workdir: Path) -> list[str] | None:
    limit = ["--limit", f"deployment_{round_.deployment.replace('-', '_')}:localhost"]
    if round_.operation == "serving":
        return None
    if round_.operation == "up-changed":
        return ansible("site.yml", *changed_recipe(workdir, round_))
    if round_.operation == "upgrade":
        return ansible("playbooks/upgrade.yml", *changed_recipe(workdir, round_, transfer=True))
    if round_.operation == "rollback":
        return ansible("playbooks/rollback.yml", *limit)
    return ansible("playbooks/stop.yml", *limit)


def strike(round_: Round, run: subprocess.Popen[str] | None) -> str:
    """Break what the fault breaks; what it did, for the report."""
    node, fault = round_.node, round_.fault
    if fault in ("kill-rank", "sigstop-engine"):
        # At "a rank's start" the task that starts the container has begun; the rank to strike is the one it
        # starts, once it runs (the operation's run goes on meanwhile).
        ranks: list[Rank] = []

        def rank_runs() -> bool:
            ranks[:] = [r for r in read_ranks() if r.deployment == round_.deployment and r.node == node and r.running]
            return bool(ranks)

        if not rank_runs() and (run is None or wait_until(rank_runs, RANK_WAIT_S, every_s=1) is None):
            return "no rank ran to strike"
        signal_name = "KILL" if fault == "kill-rank" else "STOP"
        on_node(node, f"docker kill --signal {signal_name} {ranks[0].container}")
        return f"{signal_name} {ranks[0].container}@{node}"
    if fault == "kill-node":
        sh(["docker", "kill", f"{LAB}-{node}"])
        return f"killed {node}'s container"
    if fault == "restart-dockerd":
        on_node(node, "systemctl restart docker", timeout=180)
        return f"restarted dockerd on {node}"
    if fault == "memory-drop":
        meminfo = STATE / "nodes" / node / "meminfo"
        text = meminfo.read_text(encoding="utf-8")
        (STATE / "nodes" / node / "meminfo.chaos").write_text(text, encoding="utf-8")
        meminfo.write_text(re.sub(r"^MemAvailable:\s+\d+ kB", "MemAvailable:     1048576 kB", text, flags=re.M),
                           encoding="utf-8")
        return f"{node}'s MemAvailable at 1 GiB"
    if fault == "gid-change":
        path = STATE / "nodes" / node / "node.json"
        config = json.loads(path.read_text(encoding="utf-8"))
        (STATE / "nodes" / node / "node.json.chaos").write_text(json.dumps(config), encoding="utf-8")
        for interface in config.get("interfaces", []):
            if "rdma" in interface:
                interface["rdma"]["gid_index"] = 5
        path.write_text(json.dumps(config, indent=2), encoding="utf-8")
        on_node(node, "systemctl restart sparkserve-lab-hw.service")
        return f"{node}'s GID index 5"
    if fault == "link-down":
        on_node(node, f"ip link set {TWIN} down")
        return f"{node}'s {TWIN} down"
    if fault in ("hub-stop", "registry-stop"):
        service = "hub" if fault == "hub-stop" else "registry"
        sh(["docker", "stop", "-t", "1", f"{LAB}-{service}"])
        return f"stopped the {service}"
    if fault == "disk-full":
        done = on_node(node, DISK_FILL)
        if done.returncode != 0:
            raise RuntimeError(f"could not fill {node}'s models disk: {done.stderr.strip()[-300:]}")
        return f"{node}'s models disk full ({done.stdout.strip()} KiB free)"
    if fault == "kill-controller" and run is not None:
        os.killpg(run.pid, signal.SIGKILL)
        return "SIGKILL to the controller's run"
    return "nothing to strike"


def heal(round_: Round) -> None:
    """Put back what the fault broke outside the software; healing the deployments is the software's job."""
    node, fault = round_.node, round_.fault
    if fault == "sigstop-engine":
        on_node(node, "for c in $(docker ps -q --filter label=sparkserve.fingerprint); do "
                      "docker kill --signal CONT $c >/dev/null 2>&1; done")
    elif fault == "kill-node" and not node_up(node):
        sh(["docker", "start", f"{LAB}-{node}"], check=True)
        wait_until(lambda: on_node(node, "systemctl is-system-running --wait").returncode in (0, 1), 180)
    elif fault == "memory-drop":
        saved = STATE / "nodes" / node / "meminfo.chaos"
        if saved.exists():
            saved.replace(STATE / "nodes" / node / "meminfo")
    elif fault == "gid-change":
        saved = STATE / "nodes" / node / "node.json.chaos"
        if saved.exists():
            saved.replace(STATE / "nodes" / node / "node.json")
            on_node(node, "systemctl restart sparkserve-lab-hw.service")
    elif fault == "link-down":
        on_node(node, f"ip link set {TWIN} up")
    elif fault == "disk-full":
        done = on_node(node, DISK_FREE)
        if done.returncode != 0:
            raise RuntimeError(f"could not free {node}'s models disk: {done.stderr.strip()[-300:]}")
    elif fault in ("hub-stop", "registry-stop"):
        sh(["docker", "start", f"{LAB}-{'hub' if fault == 'hub-stop' else 'registry'}"], check=True)


def wait_until(ready: Callable[[], bool], bound_s: float, every_s: float = 2.0) -> float | None:
    """Seconds until READY, asked every EVERY_S; None past BOUND_S."""
    start = time.monotonic()
    while time.monotonic() - start <= bound_s:
        if ready():
            return time.monotonic() - start
        time.sleep(every_s)
    return None


# -- a round ----------------------------------------------------------------------------------------------------

RECAP = re.compile(r"^(\S+)\s*:\s*ok=\d+\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)")


def site(log: list[tuple[str, str]], label: str) -> tuple[int, dict[str, int]]:
    done = sh(ansible("site.yml"), timeout=OPERATION_TIMEOUT_S)
    log.append((label, done.stdout + done.stderr))
    changed = {m.group(1): int(m.group(2)) for m in map(RECAP.match, done.stdout.splitlines()) if m}
    return done.returncode, changed


@dataclass
class Outcome:
    round: Round
    struck: str
    result: str
    back_s: float | None
    problems: list[str]
    seconds: float
    why: str = ""  # why a failed operation stopped, as its run said (its stop_reason line)


def stop_reason(lines: Sequence[str], width: int = 300) -> str:
    """Why a failed run stopped, from what the stop_reason callback prints after the recap: its line ("The run
    stopped on HOST, at TASK:") and the message on the line after it, as one line."""
    starts = [number for number, text in enumerate(lines) if text.startswith("The run stopped on ")]
    if not starts:
        return "the run printed no reason"
    said = " ".join(text.strip() for text in lines[starts[-1]:starts[-1] + 2] if text.strip())
    return said[:width]


def run_round(round_: Round, watch_url: str, key: str, workdir: Path) -> Outcome:
    started, since = time.monotonic(), time.time()
    outputs: list[tuple[str, str]] = []
    struck, result = "", ""
    with Watch(watch_url, key) as watch:
        argv = operation_argv(round_, workdir)
        if argv is None:
            watch.first_answer.wait(60)
            struck = strike(round_, None)
            fault_at = time.time()
            result, why = "serving", ""
        else:
            run = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                   start_new_session=True, cwd=ROOT, env=ENV)
            assert run.stdout is not None
            lines: list[str] = []
            fault_at = 0.0
            pattern = re.compile(round_.pattern)
            for line in run.stdout:
                lines.append(line)
                if not fault_at and pattern.search(line):
                    struck = strike(round_, run)
                    fault_at = time.time()
            code = run.wait(timeout=OPERATION_TIMEOUT_S)
            if not fault_at:
                struck = "moment not reached; struck after the run: " + strike(round_, None)
                fault_at = time.time()
            outputs.append((f"round {round_.number}: {round_.operation}", "".join(lines)))
            result = "passed" if code == 0 else f"failed (exit {code})"
            why = stop_reason(lines) if code != 0 else ""
        # What only a person can put back (a node, a link, the hub) is put back now; what the software must heal
        # itself (a rank, a dockerd, a run killed) is left to it.
        # The software's time back to serving counts from the moment it can heal: the strike, or for a fault of
        # the world around it, the moment that was put back.
        heal_from = fault_at
        if round_.fault in HEALED_FROM_OUTSIDE:
            if argv is None:
                # While serving, the fault acts until a rank is seen dead, or for the fault's bound at most.
                wait_until(lambda: bool(watch.dead_now), BOUNDS_S[round_.fault] / 4, every_s=1)
            heal(round_)
            heal_from = time.time()
        # Within the fault's bound every deployment serves (no rank dead as the ranks were read after the
        # fault), or holds a clear state with every rank stopped.
        stopped = [round_.deployment] if round_.operation == "stop" and result == "passed" else []
        serving: dict[str, bool] = {}

        def settled() -> bool:
            if watch.sampled_at <= fault_at:
                return False
            serving.update({name: watch.ask(name) == 200 and name not in watch.dead_now for name in SERVED})
            return not unclear_deployments(serving, supervisor_states(), read_ranks(), stopped)

        back = wait_until(settled, BOUNDS_S[round_.fault], every_s=3)
        back_s = (time.time() - heal_from) if back is not None and all(serving.values()) else None
        if round_.fault not in HEALED_FROM_OUTSIDE:
            heal(round_)
    problems = [] if back is not None else unclear_deployments(serving, supervisor_states(), read_ranks(), stopped)
    problems += answers_from_dead(watch.answers, watch.dead)
    problems += not_converged(site(outputs, "site.yml after the round"), site(outputs, "site.yml again"))
    problems += stale_locks(read_locks(), judge_lock)
    problems += mixed_fingerprints(read_ranks())
    problems += unverified_repositories(verify_repositories())
    problems += leaked_secrets(texts_to_search(since, outputs), secrets())
    return Outcome(round_, struck, result, back_s, problems, time.monotonic() - started, why)


def judge_lock(run: Any) -> tuple[str, str]:
    """How the lock's action plugin judges the run that holds a lock, from this controller."""
    sys.path.insert(0, str(ROOT / "collections"))
    from ansible_collections.sparkserve.deploy.plugins.plugin_utils import controller_run  # noqa: PLC0415

    return controller_run.judge_run(run, judge_identity())


# -- the lab of the rounds ----------------------------------------------------------------------------------------

def lab_up() -> None:
    """The lab with the gateway and the two deployments, serving (kept when it is already that lab)."""
    cluster = INVENTORY / "cluster.sparks.yml"
    if not (cluster.is_file() and "lab-tp1" in cluster.read_text(encoding="utf-8") and all(map(node_up, NODES))):
        extra = json.dumps({"lab_nodes": 2, "lab_gateway": True, "lab_deployments": DEPLOYMENTS})
        # The lab playbook runs on the controller alone (the lab inventory is what it writes).
        sh([str(Path(sys.executable).with_name("ansible-playbook")), str(ROOT / "playbooks/lab.yml"), "-e", extra],
           timeout=1800, check=True)
    done = sh(ansible("site.yml"), timeout=OPERATION_TIMEOUT_S)
    if done.returncode != 0:
        raise SystemExit(f"chaos: site.yml on the lab failed before any round:\n{done.stdout[-3000:]}")


def gateway_url() -> str:
    """The gateway on spark-1 (the lab's first node), as the inventory places it."""
    spark1 = lab_settings()
    return f"http://{spark1.get('ansible_host', 'spark-1')}:{spark1.get('gateway_port', 4000)}"


def line(outcome: Outcome) -> str:
    r = outcome.round
    back = f"{outcome.back_s:.0f}s" if outcome.back_s is not None else "-"
    verdict = "ok" if not outcome.problems else f"FAIL ({len(outcome.problems)})"
    return (f"{r.number:>3}  seed {r.seed}  {r.operation:<10} {r.deployment:<8} {r.fault:<16} {r.node:<8} "
            f"at {r.moment:<24} struck: {outcome.struck:<40} run: {outcome.result:<16} back {back:>5}  "
            f"{outcome.seconds:>4.0f}s  {verdict}")


def plant(kind: str) -> list[str]:
    """Plant one violation on the serving lab, read its invariant as a round does, take the plant away: what
    the invariant said (it must say something)."""
    if kind == "stale-lock":
        gone = subprocess.Popen(["true"])
        gone.wait()
        here = judge_identity()
        holder = {"owner": "a planted run", "since": time.time(), "renewed": time.time(), "lease_s": 1800,
                  "token": "0" * 32, "run": dict(here, pid=gone.pid, pid_start=1, label="a planted run")}
        path = "/run/sparkserve/locks/lab-tp1.lock"
        on_node("spark-1", f"mkdir -p /run/sparkserve/locks && cat > {path}", stdin=json.dumps(holder))
        try:
            return stale_locks(read_locks(), judge_lock)
        finally:
            on_node("spark-1", f"rm -f {path}")
    if kind == "token":
        since = time.time()
        path = "/var/log/sparkserve-chaos-planted.log"
        key = secrets()["the gateway key in gateway-key"]
        on_node("spark-2", f"cat > {path}", stdin=f"Authorization: Bearer {key}\n")
        try:
            return leaked_secrets(texts_to_search(since, []), secrets())
        finally:
            on_node("spark-2", f"rm -f {path}")
    if kind == "fingerprints":
        image = on_node("spark-2", "docker ps --filter label=sparkserve.deployment=lab-tp2 --format '{{.Image}}'")
        on_node("spark-2", "docker run -d --name lab-tp2-planted --label sparkserve.deployment=lab-tp2 "
                           f"--label sparkserve.fingerprint={'f' * 64} --entrypoint sleep "
                           f"{image.stdout.split()[0]} 600")
        try:
            return mixed_fingerprints(read_ranks())
        finally:
            on_node("spark-2", "docker rm -f lab-tp2-planted")
    raise SystemExit(f"chaos: nothing to plant called {kind}")


def judge_identity() -> dict[str, Any]:
    sys.path.insert(0, str(ROOT / "collections"))
    from ansible_collections.sparkserve.deploy.plugins.plugin_utils import controller_run  # noqa: PLC0415

    return dict(controller_run.run_identity(os.getpid()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--seed", type=int, default=int(time.time()) % 100000)
    parser.add_argument("--round", type=int, default=0, help="replay this round of the seed alone")
    parser.add_argument("--report", type=Path, default=ROOT / ".cache" / "chaos-report.txt")
    parser.add_argument("--plan", action="store_true", help="print the rounds' draw and touch nothing")
    parser.add_argument("--plant", choices=["stale-lock", "token", "fingerprints"], action="append", default=[],
                        help="plant this violation on the serving lab, show its invariant failing, take it away")
    args = parser.parse_args(argv)
    if args.plant:
        said = {kind: plant(kind) for kind in args.plant}
        for kind, problems in said.items():
            print(f"planted {kind}: " + ("; ".join(problems) if problems else "NOT SEEN by its invariant"))
        return 0 if all(said.values()) else 1
    numbers = [args.round] if args.round else list(range(1, args.rounds + 1))
    rounds = [draw(args.seed, n) for n in numbers]
    if args.plan:
        for r in rounds:
            print(f"{r.number:>3}  {r.operation:<10} {r.deployment:<8} {r.fault:<16} {r.node:<8} at {r.moment}")
        return 0
    lab_up()
    url, key = gateway_url(), (STATE / "gateway-key").read_text(encoding="utf-8").strip()
    args.report.parent.mkdir(parents=True, exist_ok=True)
    outcomes = []
    with tempfile.TemporaryDirectory(prefix="sparkserve-chaos-") as workdir, args.report.open("w") as report:
        for round_ in rounds:
            outcome = run_round(round_, url, key, Path(workdir))
            outcomes.append(outcome)
            for text in [line(outcome)] + ([f"       why: {outcome.why}"] if outcome.why else []) + [
                    f"       {p}" for p in outcome.problems] + (
                    [f"       replay: {round_.replay()}"] if outcome.problems else []):
                print(text, flush=True)
                report.write(text + "\n")
        failed = [o for o in outcomes if o.problems]
        backs = [o.back_s for o in outcomes if o.back_s is not None]
        back = (f"back to serving in {min(backs):.0f}-{max(backs):.0f}s ({len(backs)} rounds)" if backs
                else "no round needed to come back to serving")
        summary = (f"chaos seed {args.seed}: {len(outcomes) - len(failed)} of {len(outcomes)} rounds hold every "
                   f"invariant; {back}; {sum(o.seconds for o in outcomes) / 60:.0f} min")
        print(summary)
        report.write(summary + "\n")
        for o in failed:
            print(f"failed: round {o.round.number}: {o.round.replay()}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
