"""The flags each engine version's own parser accepts: the lists tools/engine-flags.py writes into flags/.

Each list is one file, ``flags/ENGINE-VERSION.json``, made from the engine's
real command-line parser for that version. A recipe's ``engine_flags.version``
names the list its ``engine_args`` are checked against (by default the newest
this checkout ships for the recipe's engine); ``versions`` says which exist.

Read on the controller only (recipe validation runs in the playbook's process).
"""

from __future__ import annotations

import functools
import json
import os
import re
from dataclasses import dataclass
from typing import List, Mapping, Optional, Tuple

FLAGS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "flags")
SWITCH = "switch"
VALUE = "value"


@dataclass(frozen=True)
class FlagList:
    """The long flags (without dashes) of one engine version, each a switch or one taking a value."""

    engine: str
    version: str
    parser: str
    made_from: str
    flags: Mapping[str, str]

    @property
    def file(self) -> str:
        return "plugins/module_utils/engines/flags/%s-%s.json" % (self.engine, self.version)


def _version_key(version: str) -> Tuple[Tuple[int, str], ...]:
    """Order versions by their numeric parts (0.9.2 before 0.31.0), text parts after numbers."""
    return tuple((int(part), "") if part.isdigit() else (1 << 30, part) for part in re.split(r"[.+-]", version))


def versions(engine: str) -> List[str]:
    """The versions of ENGINE whose flag lists this checkout ships, oldest first."""
    prefix = engine + "-"
    try:
        names = os.listdir(FLAGS_DIR)
    except FileNotFoundError:
        return []
    found = [name[len(prefix):-len(".json")] for name in names if name.startswith(prefix) and name.endswith(".json")]
    return sorted(found, key=_version_key)


def newest(engine: str) -> Optional[str]:
    """The newest version of ENGINE with a shipped flag list, or None when there is none."""
    shipped = versions(engine)
    return shipped[-1] if shipped else None


@functools.lru_cache(maxsize=None)
def load(engine: str, version: str) -> FlagList:
    """ENGINE VERSION's flag list; FileNotFoundError when none is shipped, ValueError when it is malformed."""
    path = os.path.join(FLAGS_DIR, "%s-%s.json" % (engine, version))
    with open(path, encoding="utf-8") as handle:
        document = json.load(handle)
    if not isinstance(document, dict):
        document = {}
    flags = document.get("flags")
    if document.get("engine") != engine or document.get("version") != version or not isinstance(flags, dict) \
            or any(kind not in (SWITCH, VALUE) for kind in flags.values()):
        raise ValueError("%s is not a flag list of %s %s as tools/engine-flags.py writes it" % (path, engine, version))
    return FlagList(engine=engine, version=version, parser=str(document.get("parser", "")),
                    made_from=str(document.get("made_from", "")), flags=flags)
