#!/usr/bin/python3
"""Supervisor of one sparkserve deployment, run on its head: it heals the deployment while it serves.

What it watches, every ``supervise.interval_s`` seconds (one *step*):

* the render the launch recorded on the head (``render_path``, re-read at every
  step): a new fingerprint or a new modification time means a launch (or a
  stop and start) happened, and the supervisor starts afresh.  Without a
  render there is nothing to supervise;
* the deployment's launch lock (``LOCK_DIR/NAME.lock``, the format of the
  ``deployment_lock`` module): while another run holds it, the supervisor does
  nothing at all;
* every rank's container, on its node (``docker inspect``): one that exited,
  that the kernel's out-of-memory killer ended, or that is gone;
* the ranks' log lines since the previous step (``docker logs --since``),
  against the engine adapter's fatal patterns (NCCL watchdog timeouts, a dead
  engine);
* real readiness of the API on the head, with the engine's own paths: the
  health path answers 200 without the adapter's dead pattern, the model list
  names the served model, and a one-token completion answers, within
  ``supervise.probe_timeout_s`` (a hung engine still answers its health path).

What it does: a rank that stopped, or a fatal log line, heals at once;
``supervise.failures_before_heal`` failed probes in a row heal too.  A heal
takes the launch lock, saves every rank's last log lines on the head, stops
every rank (the reverse of the start order), waits until every node's
MemAvailable is back to the recipe's ``memory.min_available_gib``, starts the
same containers again in the recipe's order (it never creates one: the render
and its fingerprint stay those of the launch), waits for real readiness, and
gives the lock back.  Attempts back off (``backoff_s``, doubled at each further
attempt within the hour, at most ``backoff_max_s``).  Past
``max_restarts_per_hour`` attempts, or when a rank's container is gone, it stops
every rank and holds ``needs attention: ...``; when memory does not come back
it holds ``needs reboot: NODE ...`` with every rank stopped.  A hold lasts until
the render changes (the operator runs site.yml).

Why ssh: the other nodes are reached with the ``ssh_argv`` the role gives (the
peer key, known hosts and user the ``access`` stage already set up), so the
nodes run no agent and open no port for the supervisor: it has the trust the
deployment already has, and no more.  A node whose ssh cannot connect (status
255) is waited for; after a reboot the supervisor acts once every node answers.

Usage::

    sparkserve-supervisor.py --config /etc/sparkserve/supervisor/DEPLOYMENT.json
    sparkserve-supervisor.py --config FILE --check-config   # validate, print OK
    sparkserve-supervisor.py --config FILE --once           # one step, then exit

Config (JSON object, unknown keys refused)::

    {"deployment": "lab-tp2",
     "render_path": "/var/lib/sparkserve/deployments/lab-tp2/current.json",
     "head": "spark-1",
     "nodes": {"spark-1": {"address": "10.77.1.11"}, "spark-2": {"address": "10.77.1.12"}},
     "rank_hosts": {"0": "spark-1", "1": "spark-2"},
     "ssh_argv": ["ssh", "-i", "KEY", "-o", "BatchMode=yes", "-o", "ConnectTimeout=5", "-l", "root"],
     "meminfo_path": "/proc/meminfo",
     "lock_dir": "/run/sparkserve/locks",
     "state_dir": "/var/lib/sparkserve/supervisor",
     "api_base": "http://127.0.0.1:8000",
     "wildcard_hosts": ["0.0.0.0", "::"],
     "pause_file": "/etc/sparkserve/supervisor/lab-tp2.paused",
     "flusher_unit": "sparkserve-flusher@lab-tp2.service",
     "memguard_unit": "sparkserve-memguard.service",
     "metrics_path": "/var/lib/node_exporter/textfile/sparkserve-supervisor-lab-tp2.prom",
     "rdma_devices": ["rocep1s0f1", "roceP2p1s0f1"]}

``pause_file``, ``flusher_unit``, ``memguard_unit``, ``metrics_path`` and
``rdma_devices`` may be left out.  After a heal over several nodes of a render
whose ranks run with ``NCCL_DEBUG=INFO`` (every launch of sparkserve asks for
it), every rank's log since the heal began is read for the network NCCL chose,
as the launch reads it: ``transport-DEPLOYMENT.prom`` beside ``metrics_path``
gets ``sparkserve_rank_transport_info`` of each rank, a ``transport`` event
names each rank not on RDMA over every one of ``rdma_devices``, and with the
recipe's ``fabric.require_rdma`` (the default) that heal fails.  While the pause file
exists the supervisor does nothing (an operator working on the nodes creates
it).  The flusher unit, when given, is started on every node before the ranks
start again and stopped once they are ready (or the attempt ends), as the
launch runs it: the page cache of the weights being read competes with the
GPU on unified memory during every load.  The memory guard's unit, when given,
is started on every node before the ranks (it is not running after a reboot
unless the recipe starts it at boot), so that it watches the load, as after a
launch.

States (the state file's ``state``)::

    waiting for a launch                      no render: nothing to supervise
    waiting for a launch: PATH is unusable: WHY
    disabled: the recipe's supervise.enabled is false
    watching                                  every check passed
    watching (K of N probes failed: CAUSE)
    paused: the deployment is locked by OWNER
    waiting for nodes: NODE, NODE             ssh (or docker there) does not answer
    healing (attempt K, PHASE): CAUSE         PHASE: saving the logs, stopping every rank,
                                              waiting for memory, starting the ranks, waiting for readiness
    backing off until TIME: CAUSE             TIME: ISO 8601 UTC, like 2027-01-15T08:00:30Z
    needs attention: rank N's container NAME is gone; run site.yml
    needs attention: restart limit reached (N in the last hour); last cause: CAUSE
    needs reboot: NODE (MemAvailable X GiB, needs Y GiB)[; NODE (...)]

Causes: ``rank N on NODE is not running (exited with code C | killed by the
kernel's out-of-memory killer | gone)``, ``rank N on NODE logged: LINE``,
``the head does not answer: DETAIL``, ``completions time out while /health
answers (hang)``.

Events (``event``, and its fields): ``render_changed`` (fingerprint, previous),
``node_unreachable`` (nodes: node -> why), ``container_gone`` (cause, rank,
node, container), ``heal_started`` (cause, attempt), ``healed`` (cause,
attempt, seconds, stopped_s, memory_s, ready_s: seconds from the heal's start
to ready, to every rank stopped, then waiting for memory, then from the first
start to ready), ``heal_failed`` (cause, attempt, why), ``needs_reboot``
(cause, nodes: node -> mem_available_bytes, needs_bytes) and ``gave_up``
(cause, restarts_last_hour).

Records, in ``STATE_DIR``: ``DEPLOYMENT.events.jsonl`` (one JSON object a line:
time, deployment, event, state and the event's fields; each line is printed
too, for the journal), ``DEPLOYMENT.state.json`` (the state, rewritten at every
step; it also keeps the render seen and the attempts of the last hour, so a
restarted supervisor keeps counting them for the same render; a hold is not
kept: a restarted supervisor finds its fault again) and the logs saved before
each restart, ``DEPLOYMENT/logs/TIME/rankN-NODE.log``.  The restart counts are
those of the current render (a launch sets them to 0).

Metrics: with ``metrics_path`` (an absolute path) the supervisor writes a
Prometheus node-exporter textfile (node_exporter's textfile collector reads
only files named ``*.prom``) after every step and whenever its state changes
(each phase of a heal, too).  Each write replaces the whole file (written to
a hidden temporary file beside it, then renamed); the folder must exist.  A file that
cannot be written is said once on stderr and the supervisor carries on.
SIGTERM (or SIGINT) removes the file: a stopped supervisor leaves no figures;
an exit with status 1 leaves it, its timestamp no longer moving, and
``--once`` leaves the file of its one step.  Families, each with the label
``deployment``::

    sparkserve_supervisor_state                        gauge    label state too: one sample per
                                                                state name, 1 for the current one
    sparkserve_supervisor_restarts_total               counter  heal attempts (every rank restarted)
                                                                made since it started, plus the
                                                                restarts_total of the state file it
                                                                started from
    sparkserve_supervisor_paused                       gauge    1 when the pause file exists, else 0
    sparkserve_supervisor_last_check_timestamp_seconds gauge    unix time the last step began

The state names (the start of the states above): starting, waiting for a
launch, disabled, watching, paused (by the lock or by the operator's pause
file), waiting for nodes, healing, backing off, needs attention, needs reboot.

SIGTERM ends a heal where it is (the lock is given back); the supervisor, when
it runs again, finds the ranks stopped and heals them.

Exit status: 0 on SIGTERM (or SIGINT) and after ``--once``; 1 when the state
directory or the lock directory cannot be written; 2 for a bad config or bad
arguments (errors about the config go to stderr).

The program is this file and the supervisor package of sparkserve's node
library (plugins/module_utils/node/supervisor in the collection), which the
sparkserve role installs once per node as ``sparkserve_node`` in
``sparkserve_node_library_dir``; the unit puts that folder on PYTHONPATH.
"""

from __future__ import annotations

import sys

from sparkserve_node.supervisor.program import main

if __name__ == "__main__":
    sys.exit(main())
