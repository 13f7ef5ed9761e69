#!/usr/bin/env python3
"""Turn a run the sparkserve command kept (artifacts/runs/RUN/job_events) into a small JSON-lines fixture.

    tools/record-cli-fixture.py artifacts/runs/20261202T011215Z-up tests/cli/fixtures/lab_up.jsonl

Keeps, of each event, what the command reads (its kind, time, counter, play, task, host, role, the
task's message, failure and progress fields, the run's stats) and drops the rest (module arguments,
diffs, every other field of a result). The checkout's own path is replaced by /srv/sparkserve, and the
value of any environment variable named on the command line with --mask NAME, by ********.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
KEEP_DATA = ("play", "task", "host", "role", "ignore_errors", "task_action", "resolved_action", "name",
             "artifact_data", "failures", "dark", "ok", "changed", "skipped", "rescued", "ignored", "processed",
             "pid")
KEEP_RES = ("msg", "failed", "changed", "skipped", "unreachable", "attempts", "retries", "item",
            "_ansible_item_label", "sparkserve_progress", "sparkserve_probe", "stdout", "stderr", "rc")


def slim_res(res: Any) -> Any:
    if not isinstance(res, dict):
        return res
    out = {key: res[key] for key in KEEP_RES if key in res}
    if isinstance(res.get("results"), list):
        out["results"] = [slim_res(item) for item in res["results"]]
    return out


def slim(event: dict[str, Any]) -> dict[str, Any]:
    data = event.get("event_data") or {}
    kept = {key: data[key] for key in KEEP_DATA if key in data}
    if "res" in data:
        kept["res"] = slim_res(data["res"])
    out = {key: event[key] for key in ("event", "counter", "created", "uuid") if key in event}
    out["event_data"] = kept
    if event.get("event") in ("verbose", "error", "playbook_on_stats") and event.get("stdout"):
        out["stdout"] = event["stdout"]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path, help="a run folder under artifacts/runs")
    parser.add_argument("out", type=Path, help="the JSON-lines fixture to write")
    parser.add_argument("--mask", action="append", default=[], metavar="NAME",
                        help="an environment variable whose value must not appear (repeatable)")
    args = parser.parse_args()
    files = sorted((args.run / "job_events").glob("*.json"), key=lambda p: int(p.name.split("-", 1)[0]))
    events = [slim(json.loads(path.read_text())) for path in files if not path.name.endswith("-partial.json")]
    text = "".join(json.dumps(event, sort_keys=True) + "\n" for event in events)
    text = text.replace(str(ROOT), "/srv/sparkserve")
    for name in args.mask:
        secret = os.environ.get(name, "")
        if secret:
            text = text.replace(secret, "********")
    args.out.write_text(text)
    print(f"{args.out}: {len(events)} events, {len(text)} bytes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
