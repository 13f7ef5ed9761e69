"""Reading and checking a node program's settings (its JSON config file, or its arguments)."""

from __future__ import annotations

import argparse
import json
import re
import sys
from typing import Any, Callable, Mapping, Optional, Sequence, TypeVar

# Docker's rule for container names; a deployment's name also names files.
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
T = TypeVar("T")
NAME_RULE = "a name of letters, digits, '_', '.' and '-' that starts with a letter or digit"


class ConfigError(Exception):
    """The config file is unusable; the message names the key and the fix."""


def is_int(value: object) -> bool:
    """A whole number, not a boolean."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: object) -> bool:
    """A number, not a boolean."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def name_value(raw: Mapping[str, Any], key: str) -> str:
    """raw[key], a name (NAME_PATTERN); ConfigError otherwise."""
    value = raw[key]
    if not isinstance(value, str) or not NAME_PATTERN.fullmatch(value):
        raise ConfigError(f"{key} is {json.dumps(value)}; set {NAME_RULE}")
    return value


def read_json(path: str) -> object:
    """The decoded content of a JSON config file; ConfigError when it cannot be read or is not JSON."""
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except OSError as err:
        raise ConfigError(f"cannot read it: {err.strerror}") from err
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise ConfigError(f"not valid JSON: {err}") from err



def run_config_program(argv: Optional[Sequence[str]], program: str, description: str, config_help: str,
                       once_help: str, load: Callable[[str], T], run: Callable[[T, bool], int]) -> int:
    """The command line of a program run from a JSON config (the memory guard, the supervisor):
    ``--config FILE [--check-config | --once]``. A bad config is said on stderr (``PROGRAM config FILE: WHY``)
    with status 2; --check-config prints OK; otherwise run(config, once) gives the status."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--config", required=True, help=config_help)
    parser.add_argument("--check-config", action="store_true", help="validate the config, print OK")
    parser.add_argument("--once", action="store_true", help=once_help)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        config = load(args.config)
    except ConfigError as err:
        print(f"{program} config {args.config}: {err}", file=sys.stderr, flush=True)
        return 2
    if args.check_config:
        print("OK", flush=True)
        return 0
    return run(config, args.once)
