"""The settings an owner gives in the inventory, checked against every role's argument spec on the controller.

A role validates its own inputs only when a run reaches it: a wrong type in a
variable of the monitoring role would be refused after the image, the fabric
and the weights have changed the hosts. The context play
(playbooks/context.yml) checks, before any host changes, every variable the
inventory (or -e) sets that is an option of some role's entry point, with
that option's type, elements and choices, and says each problem in one
sentence naming the host, the variable, the value and what it must be.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Mapping, Tuple

import yaml
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

# Keys of an option's spec that say what a value must be; the rest (description, default, required) are for the role.
_SHAPE = ("type", "elements", "choices", "options", "no_log")

Options = Dict[str, Tuple[str, Dict[str, Any]]]


def _shape(spec: Mapping[str, Any]) -> Dict[str, Any]:
    shaped = {key: spec[key] for key in _SHAPE if key in spec}
    if isinstance(shaped.get("options"), Mapping):
        shaped["options"] = {name: _shape(sub) for name, sub in shaped["options"].items()}
    return shaped


def load_options(roles_dir: str) -> Options:
    """Every option of every role's entry points: its name, with the role that owns it and its shape.

    An option named by several entry points of one role (they share their options) has one shape; the first
    entry point that names it is the one said.
    """
    options: Options = {}
    for role in sorted(os.listdir(roles_dir)):
        path = os.path.join(roles_dir, role, "meta", "argument_specs.yml")
        if not os.path.isfile(path):
            continue
        with open(path, encoding="utf-8") as handle:
            specs = (yaml.safe_load(handle) or {}).get("argument_specs") or {}
        for entry in specs.values():
            for name, spec in ((entry or {}).get("options") or {}).items():
                options.setdefault(name, (role, _shape(spec or {})))
    return options


def _what(spec: Mapping[str, Any]) -> str:
    kind = str(spec.get("type", "str"))
    what = ("an " if kind[0] in "aeiou" else "a ") + kind + (f" of {spec['elements']}" if spec.get("elements") else "")
    if spec.get("choices"):
        what += " among " + ", ".join(str(choice) for choice in spec["choices"])
    return what


def check(options: Options, settings: Mapping[str, Mapping[str, Any]]) -> List[str]:
    """One sentence per setting that is not what its option asks; ``settings`` is host -> name -> value.

    A value refused on several hosts (a group's variable, or -e) is one sentence naming them all.
    """
    refused: Dict[Tuple[str, str, str], List[str]] = {}
    for host in sorted(settings):
        for name in sorted(settings[host]):
            if name not in options:
                continue
            role, spec = options[name]
            value = settings[host][name]
            result = ArgumentSpecValidator({name: spec}).validate({name: value})
            if result.error_messages:
                shown = "(hidden)" if spec.get("no_log") else repr(value)
                refused.setdefault((name, shown, "; ".join(result.error_messages)), []).append(host)
    problems = []
    for (name, shown, error), hosts in refused.items():
        role, spec = options[name]
        problems.append(
            f"{', '.join(hosts)}: {name} is {shown}, but the {role} role takes {_what(spec)} ({error}); "
            f"fix it where the inventory sets it (roles/{role}/README.md lists the role's variables)")
    return problems


def outcome(options: Options, settings: Mapping[str, Mapping[str, Any]]) -> Dict[str, Any]:
    """The module's result: failed with every problem, or how many settings were checked."""
    problems = check(options, settings)
    if problems:
        return {"failed": True, "changed": False, "problems": problems,
                "msg": "the inventory's settings are refused before any host changes: " + "; ".join(problems) + "."}
    checked = sum(1 for host in settings for name in settings[host] if name in options)
    return {"changed": False, "checked": checked, "msg": f"{checked} settings match their roles' argument specs"}


def run(params: Mapping[str, Any]) -> Dict[str, Any]:
    """The module's work on the settings given (the action plugin reads them from the inventory instead)."""
    return outcome(load_options(params["roles_dir"]), params["settings"])
