#!/usr/bin/env python3
"""A client that keeps asking a deployment for completions, one at a time, and logs each.

One JSON line per request: when it was sent and answered (unix seconds), and
whether it succeeded. It runs until STOP_FILE exists or MAX_S have passed.
The upgrade test reads the log to show the old release answered through the
staging and to measure the swap's gap as a user sees it.
"""

from __future__ import annotations

import argparse
import json
import os
import time
import urllib.error
import urllib.request


def ask(url: str, model: str, timeout_s: float) -> bool:
    body = json.dumps({"model": model, "prompt": "The capital of France is", "max_tokens": 2}).encode()
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return response.status == 200 and len(json.load(response).get("choices", [])) == 1
    except (OSError, urllib.error.URLError, ValueError):
        return False


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="the completions endpoint")
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", required=True, help="JSON lines, one per request")
    parser.add_argument("--stop-file", required=True)
    parser.add_argument("--max-s", type=float, default=900.0)
    parser.add_argument("--pause-s", type=float, default=0.2, help="between requests")
    args = parser.parse_args()
    started = time.time()
    with open(args.out, "a", encoding="utf-8") as out:
        while not os.path.exists(args.stop_file) and time.time() - started < args.max_s:
            sent = time.time()
            ok = ask(args.url, args.model, 5.0)
            out.write(json.dumps({"sent": sent, "done": time.time(), "ok": ok}) + "\n")
            out.flush()
            time.sleep(args.pause_s)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
