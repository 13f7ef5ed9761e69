"""Close matches for a mistyped recipe key or engine flag, and plain words for a value that misses its pattern.

``suggest_fields`` finds the fields a misplaced or misspelt key probably
meant, at its own level of the schema, one level down (``tensor`` at the top
is ``parallel.tensor``), one level up, or in a sibling section.
``near_owned_flag`` finds the flag sparkserve sets itself that an
``engine_args`` key is one letter off, ``near_flags`` the engine's flags an
unknown one probably meant. ``flag_home`` says where a recipe key that is an
engine flag (``tensor_parallel_size``, ``--max-model-len``, ``tp_size``, a
letter off one) belongs: the field sparkserve sets the flag from, or
``engine_args``. ``explain_mismatch`` says what is
wrong with a value that does not match its field's pattern, more precisely
than the field's hint (a digest one digit short, a capital in a commit).

Pure standard library: this file also runs on the nodes.
"""

from __future__ import annotations

import difflib
import json
import re
from typing import Any, List, Mapping, NamedTuple, Optional, Tuple

from ansible_collections.sparkserve.deploy.plugins.module_utils.engines import ENGINES, known_flags
from ansible_collections.sparkserve.deploy.plugins.module_utils.recipe.schema import (
    _HEX40,
    _HEX64,
    _IMAGE,
    _IMAGE_HINT,
    RECIPE_SPEC,
)

# How close a key must be to a field's name (difflib's ratio) to be suggested.
_FIELD_CUTOFF = 0.75
# How close an unknown engine flag must be to a real one to be suggested.
_FLAG_CUTOFF = 0.8
# Below this length a one-letter change of a flag is as likely another real flag (SGLang dp-size, ep-size).
_SUBSTITUTION_MIN_LENGTH = 8

# ---------------------------------------------------------------- fields


def _chain(path: str) -> List[Tuple[str, Mapping[str, Any]]]:
    """(display prefix, spec) of each mapping from the recipe down to PATH (``model.file_overrides[0]``)."""
    chain: List[Tuple[str, Mapping[str, Any]]] = [("", RECIPE_SPEC)]
    shown = ""
    for name, index in re.findall(r"([^.\[\]]+)((?:\[\d+\])*)", path):
        options = chain[-1][1].get("options") or {}
        spec = options.get(name)
        if not isinstance(spec, dict) or "options" not in spec:
            break
        shown = "%s.%s%s" % (shown, name, index) if shown else name + index
        chain.append((shown, spec))
    return chain


def _below(prefix: str, name: str, spec: Mapping[str, Any]) -> str:
    """How a field of the mapping (or list of mappings) NAME under PREFIX is written."""
    here = "%s.%s" % (prefix, name) if prefix else name
    return here + "[]" if spec.get("type") == "list" else here


def _candidates(chain: List[Tuple[str, Mapping[str, Any]]]) -> List[Tuple[int, str, str]]:
    """(distance, field name, full path) of the fields a key of the last mapping of CHAIN may have meant."""
    prefix, spec = chain[-1]
    found: List[Tuple[int, str, str]] = []

    def level(distance: int, where: str, options: Mapping[str, Any]) -> None:
        found.extend((distance, key, "%s.%s" % (where, key) if where else key) for key in options)

    options = spec.get("options") or {}
    level(0, prefix, options)
    for key, sub in options.items():
        if isinstance(sub, dict) and "options" in sub:
            level(1, _below(prefix, key, sub), sub["options"])
    if len(chain) > 1:
        up_prefix, up_spec = chain[-2]
        up_options = up_spec.get("options") or {}
        level(2, up_prefix, up_options)
        own = prefix.rsplit(".", 1)[-1].split("[")[0]
        for key, sub in up_options.items():
            if key != own and isinstance(sub, dict) and "options" in sub:
                level(3, _below(up_prefix, key, sub), sub["options"])
    return found


def scored_fields(key: str, path: str) -> Tuple[List[str], float]:
    """``suggest_fields``' answer, with how close the best of them is (difflib's ratio, 1.0 for the very name)."""
    wanted = key.lower().replace("-", "_")
    scored = []
    for distance, name, full in _candidates(_chain(path)):
        ratio = difflib.SequenceMatcher(None, wanted, name).ratio()
        if ratio >= _FIELD_CUTOFF:
            scored.append((-ratio, distance, full))
    scored.sort()
    if not scored:
        return [], 0.0
    best = [full for ratio, _, full in scored if ratio <= scored[0][0] + 0.05]
    return list(dict.fromkeys(best))[:3], -scored[0][0]


def suggest_fields(key: str, path: str) -> List[str]:
    """The fields KEY, an unknown key of the mapping at PATH, probably meant; best first, at most three."""
    return scored_fields(key, path)[0]


# ---------------------------------------------------------------- engine flags


def _one_edit(a: str, b: str) -> Optional[str]:
    """How B differs from A by one letter: "insert", "delete", "swap", "replace", or None."""
    if a == b or abs(len(a) - len(b)) > 1:
        return None
    if len(a) == len(b):
        diff = [i for i in range(len(a)) if a[i] != b[i]]
        if len(diff) == 1:
            return "replace"
        if len(diff) == 2 and diff[1] == diff[0] + 1 and a[diff[0]] == b[diff[1]] and a[diff[1]] == b[diff[0]]:
            return "swap"
        return None
    short, long_ = (a, b) if len(a) < len(b) else (b, a)
    for i in range(len(long_)):
        if long_[:i] + long_[i + 1:] == short:
            return "insert" if len(b) > len(a) else "delete"
    return None


def near_owned_flag(flag: str, owned: Mapping[str, str]) -> Optional[str]:
    """The flag of OWNED that FLAG (an engine_args key, dashes for underscores) is one letter off, if any."""
    if len(flag) < 3:
        return None
    for near in difflib.get_close_matches(flag, list(owned), n=3, cutoff=0.6):
        edit = _one_edit(flag, near)
        if edit and (edit != "replace" or len(flag) >= _SUBSTITUTION_MIN_LENGTH):
            return near
    return None



def near_flags(flag: str, flags: Mapping[str, str]) -> List[str]:
    """The flags of FLAGS (one engine version's) that the unknown FLAG probably meant, best first.

    An abbreviation names the flags it abbreviates (argparse takes a unique one,
    until the engine adds a flag with the same start); otherwise the close
    spellings.
    """
    longer = sorted(known for known in flags if known.startswith(flag))
    if longer:
        return longer[:3]
    return difflib.get_close_matches(flag, list(flags), n=2, cutoff=_FLAG_CUTOFF)


class FlagHome(NamedTuple):
    """Where a recipe key that is (or is close to) an engine flag belongs."""

    flag: str  # the flag as the engine spells it, without dashes
    engine: str  # the engine whose flag it is
    field: str  # owned: the recipe field (or the words) sparkserve sets it from; "" when it goes in engine_args
    exact: bool  # the key is the flag itself, in another spelling (dashes, underscores, case)
    ratio: float  # how close the key is to the flag (difflib's ratio, 1.0 when exact)
    stranger: str = ""  # the recipe's engine when the flag is another engine's and this one lacks it


def _engine_flags(engine: str, version: Optional[str]) -> Mapping[str, str]:
    """ENGINE's flag list: of VERSION where this checkout ships it, else of the newest shipped; {} without one."""
    for wanted in (version, known_flags.newest(engine)):
        if isinstance(wanted, str) and wanted:
            try:
                return known_flags.load(engine, wanted).flags
            except (FileNotFoundError, ValueError):
                continue
    return {}


def flag_home(key: str, engine: Any = None, version: Any = None) -> Optional[FlagHome]:
    """Where KEY, a recipe key that is not a field, belongs if it is an engine flag; None when it is not one.

    ENGINE is the recipe's ``engine`` (its flags are looked at first, and only
    its own flag list for ``engine_args``; with no known engine, every
    engine's), VERSION its ``engine_flags.version``. The flags an adapter owns
    are the same recipe fields whatever the engine, so every engine's owned
    flags are looked at (``tp_size`` in a vLLM recipe is ``parallel.tensor``).
    Any spelling of the flag is the flag (``--tensor-parallel-size``,
    ``tensor_parallel_size``); else a flag sparkserve owns one letter off,
    else the engine's close match or the one flag the key abbreviates; else,
    last, another engine's flag that the recipe's engine lacks (``stranger``).
    """
    flag = key.strip().lstrip("-").lower().replace("_", "-")
    if not flag or not re.match(r"^[a-z0-9][a-z0-9.-]*$", flag):
        return None
    if not isinstance(engine, str):
        engine = None
    names = ([engine] if engine in ENGINES else []) + sorted(name for name in ENGINES if name != engine)
    adapters = [ENGINES[name] for name in names]
    # Another engine's flags go in engine_args only when the recipe names no engine sparkserve knows.
    listed = [(adapter, _engine_flags(adapter.name, version if adapter.name == engine else None))
              for adapter in (adapters[:1] if engine in ENGINES else adapters)]
    for adapter in adapters:
        if flag in adapter.owned_flags:
            return FlagHome(flag, adapter.name, adapter.owned_flags[flag], True, 1.0)
    for adapter, flags in listed:
        if flag in flags:
            return FlagHome(flag, adapter.name, "", True, 1.0)
    for adapter in adapters:
        near = near_owned_flag(flag, adapter.owned_flags)
        if near:
            return FlagHome(near, adapter.name, adapter.owned_flags[near], False,
                            difflib.SequenceMatcher(None, flag, near).ratio())
    for adapter, flags in listed:
        found = near_flags(flag, flags)
        if found and found[0].startswith(flag) and (len(found) > 1 or len(flag) < 4):
            continue  # an abbreviation of several flags, or too short to tell
        if found:
            owned = adapter.owned_flags.get(found[0], "")
            return FlagHome(found[0], adapter.name, owned, False,
                            difflib.SequenceMatcher(None, flag, found[0]).ratio())
    if engine in ENGINES:
        for adapter in adapters[1:]:
            if flag in _engine_flags(adapter.name, None):
                return FlagHome(flag, adapter.name, "", True, 1.0, engine)
    return None

# ---------------------------------------------------------------- values


def _hex_fix(value: str, digits: int, noun: str, hint: str, again: str = "") -> Optional[str]:
    """The fix of VALUE, meant as DIGITS lower-case hex digits; None when it is right or not even close (a branch).

    HINT says where the whole value is found; AGAIN, where a miscopied one is (HINT when not given).
    """
    if re.match(r"^[0-9a-f]{%d}$" % digits, value):
        return None
    if len(value) == digits and re.match(r"^[0-9a-fA-F]+$", value):
        first = next(i for i, char in enumerate(value) if char in "ABCDEF")
        return "%s is lower-case hex and character %d (%s) is upper case; write it in lower case: %s" \
               % (noun, first + 1, value[first], value.lower())
    if len(value) == digits:
        first = next(i for i, char in enumerate(value) if char not in "0123456789abcdefABCDEF")
        return "character %d (%s) is not a hex digit: %s is %d lower-case hex digits, 0-9 and a-f; %s" \
               % (first + 1, json.dumps(value[first]), noun, digits, again or hint)
    if value and re.match(r"^[0-9a-fA-F]+$", value):
        return "it has %d hex digits, not the %d of %s; %s" % (len(value), digits, noun, hint)
    return None


def _image_problem(value: str) -> str:
    """What is wrong with an image reference, and how to fix it."""
    if "@" not in value:
        return _IMAGE_HINT
    name, _, digest = value.rpartition("@")
    if not digest.startswith("sha256:"):
        return "the digest must be sha256:<64 hex>, as docker buildx imagetools inspect IMAGE prints it"
    fix = _hex_fix(digest[len("sha256:"):], 64, "a digest",
                   "copy the whole digest (docker buildx imagetools inspect IMAGE prints it)")
    if fix:
        return fix
    repo = name.rpartition("/")
    last = repo[2].split(":")[0]
    path = repo[0] + repo[1] + last
    parts = path.split("/")
    # Docker reads the first part as a registry host only when it has a dot or a port, or is localhost.
    host = parts[0] if len(parts) > 1 and (re.search(r"[.:]", parts[0]) or parts[0] == "localhost") else ""
    rest = path[len(host) + 1:] if host else path
    if rest != rest.lower():
        fixed = (host + "/" if host else "") + rest.lower() + value[len(path):]
        return ("Docker accepts only lower-case repository names (the registry host and the tag may hold capitals; "
                "docker pull refuses the rest); write %s" % fixed)
    return ("write a Docker reference: [HOST[:PORT]/]PATH[:TAG]@sha256:<64 hex>, the path in lower-case letters, "
            "digits and . _ - between slashes")


def _api_host_problem(value: str) -> str:
    """How to fix an API address that holds a port, brackets or a scheme."""
    bare = re.sub(r"^[a-z]+://", "", value).rstrip("/")
    port = ""
    match = re.match(r"^\[(.*)\](?::(\d*))?$", bare)
    if match:
        bare, port = match.group(1), match.group(2) or ""
    elif bare.count(":") == 1:
        bare, _, port = bare.partition(":")
    if port.isdigit():
        return ("give the address alone and the port in launch.api_port: api_host: %s and api_port: %s"
                % (bare or "0.0.0.0", port))
    return ("give the address alone, without a scheme, brackets, port or spaces (127.0.0.1, 0.0.0.0, ::); the port "
            "goes in launch.api_port")


def explain_mismatch(key: str, spec: Mapping[str, Any], value: str) -> Optional[str]:
    """A precise fix for VALUE of the field KEY, which does not match its pattern; None to use the hint."""
    pattern = spec.get("pattern")
    if pattern == _IMAGE:
        return _image_problem(value)
    if key == "api_host":
        return _api_host_problem(value)
    if pattern == _HEX40:
        return _hex_fix(value, 40, "a commit", str(spec.get("hint", "")).replace("{value}", value),
                        'copy the commit again (HfApi().model_info(repo, revision="main").sha gives the newest)')
    if pattern == _HEX64:
        return _hex_fix(value, 64, "a sha256", str(spec.get("hint", "")))
    return None
