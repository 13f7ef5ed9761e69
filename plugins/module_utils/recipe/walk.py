"""The recipe's schema walked: each field's type and form, defaults filled, ``*_from`` fields resolved.

``Checker`` walks a loaded recipe against ``RECIPE_SPEC`` (schema.py): each
field's type, choices, pattern and range, the unknown keys (with the close
match, or, for a key that is an engine flag, the field that carries it or
``engine_args``), the required fields, the defaults and ``default_template``. ``resolve``
fills every ``KEY`` from the variable its ``KEY_from`` names and reports each
variable that is not set; ``variables_named`` lists those variables. ``message``
and ``show`` word every problem, here and in checks.py: the recipe, the field,
the value (masked where it looks secret) and the fix.

Pure standard library: this file also runs on the nodes.
"""

from __future__ import annotations

import copy
import json
import re
import string
from typing import Any, Callable, Dict, List, Mapping, Tuple

from ansible_collections.sparkserve.deploy.plugins.module_utils.engines import known_flags
from ansible_collections.sparkserve.deploy.plugins.module_utils.recipe import suggest
from ansible_collections.sparkserve.deploy.plugins.module_utils.recipe.schema import _VARIABLE, RECIPE_SPEC
from ansible_collections.sparkserve.deploy.plugins.module_utils.secrets import MASK, looks_like_token, looks_secret

TYPE_WORDS = {
    "str": "a string",
    "int": "an integer",
    "number": "a number",
    "bool": "true or false",
    "dict": "a mapping",
    "list": "a list",
}


# ---------------------------------------------------------------- messages

def show(value: Any) -> str:
    try:
        return json.dumps(value, sort_keys=False)
    except (TypeError, ValueError):
        return repr(value)


def message(name: str, path: str, value: Any, fix: str) -> str:
    # The value of a secret-looking env name or engine flag is never printed.
    parts = path.split(" ")[0].split(".", 1)
    secret = (parts[0] in ("env", "engine_args") and len(parts) == 2 and looks_secret(parts[1])) \
        or holds_token(value)
    return "recipe %s: %s is %s; %s." % (name, path, MASK if secret else show(value), fix.rstrip("."))


def holds_token(value: Any) -> bool:
    """Whether VALUE, or anything in it, has the form of a credential."""
    try:
        return looks_like_token(value if isinstance(value, str) else json.dumps(value, default=str))
    except (TypeError, ValueError):
        return False


def _summary(description: str) -> str:
    """The first sentence of a field's description, without Markdown."""
    text = re.sub(r"\s*\(see [^)]*\)", "", description).replace("`", "").replace("*", "")
    return text.split(". ")[0].rstrip(".")


def _join(path: str, key: str) -> str:
    return "%s.%s" % (path, key) if path else key


def _is_field(words: str) -> bool:
    """Whether an owned flag's WORDS (engine adapters' owned_flags values) are a recipe field, not a description."""
    return " " not in words and words.split(".")[0] in (RECIPE_SPEC.get("options") or {})


def _flag_file(engine: str) -> str:
    """Where ENGINE's newest shipped flag list is (for a message)."""
    newest = known_flags.newest(engine)
    return "plugins/module_utils/engines/flags/%s-%s.json" % (engine, newest) if newest \
        else "plugins/module_utils/engines/flags/"


def unknown_key_error(name: str, path: str, key: str, value: Any, options: Mapping[str, Any],
                      engine: Any = None, version: Any = None) -> str:
    """The one sentence for KEY, which the mapping at PATH (of the fields OPTIONS) does not have: its close
    field, the field or engine_args that carries the engine flag it is, or the mapping's fields.

    ENGINE and VERSION are the recipe's engine and engine_flags.version, as given."""
    where = path or "a recipe"
    here = _join(path, key)
    near, closeness = suggest.scored_fields(key, path)
    home = suggest.flag_home(key, engine, version)
    if home is not None and closeness < 1.0 and (home.exact or home.ratio > closeness):
        shown = MASK if looks_secret(home.flag) or holds_token(value) else show(value)
        if home.stranger:
            fix = ("which %s, this recipe's engine, does not have: give %s's own flag in engine_args (its flags "
                   "are in %s)" % (home.stranger, home.stranger, _flag_file(home.stranger)))
        elif not home.field:
            fix = "which goes in engine_args: write `engine_args: {%s: %s}`%s instead" % (
                home.flag, shown, " at the top of the recipe" if path else "")
        elif _is_field(home.field):
            fix = "which sparkserve sets itself from `%s`: set `%s` instead and remove this key" % (
                home.field, home.field)
        else:
            fix = "which sparkserve sets itself from %s: remove this key" % home.field
        return "recipe %s: %s is %s, and not a field of %s; %s the %s flag --%s, %s." % (
            name, here, shown, where, "it is" if home.exact else "it looks like", home.engine, home.flag, fix)
    fix = ("did you mean %s? (the fields are in recipes/README.md)" % " or ".join("`%s`" % n for n in near)
           if near else "use one of: %s (see recipes/README.md)" % ", ".join(options))
    return "recipe %s: %s is not a field of %s; %s." % (name, here, where, fix.rstrip("."))


# ---------------------------------------------------------------- checking

def is_type(value: Any, kind: str) -> bool:
    if kind == "raw":
        return True
    if kind == "str":
        return isinstance(value, str)
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == "dict":
        return isinstance(value, dict)
    if kind == "list":
        return isinstance(value, list)
    raise ValueError("unknown schema type %r" % kind)


def _type_fix(kind: str, value: Any) -> str:
    fix = "it must be %s" % TYPE_WORDS.get(kind, kind)
    if kind == "str" and isinstance(value, (bool, int, float)):
        fix += ' (quote it: YAML reads bare yes, no, on, off and numbers as non-strings)'
    return fix


class Checker:
    """Walks a value against a field spec, collecting messages."""

    def __init__(self, name: str, resolved: Mapping[str, str]) -> None:
        self.name = name
        self.resolved = resolved  # dotted path -> variable it was taken from
        self.errors: List[str] = []
        # The recipe's engine and engine_flags.version, as given (read by mapping at the top): an unknown key
        # that is an engine flag is looked up in that engine's flags.
        self.engine: Any = None
        self.flags_version: Any = None

    def label(self, path: str) -> str:
        return field_label(path, self.resolved)

    def error(self, path: str, value: Any, fix: str) -> None:
        self.errors.append(message(self.name, self.label(path), value, fix))

    def field(self, spec: Mapping[str, Any], value: Any, path: str) -> Any:
        kind = spec.get("type", "raw")
        if not is_type(value, kind):
            self.error(path, value, _type_fix(kind, value) + self._flag_hint(path, kind))
            return value
        if kind == "dict":
            if "options" in spec:
                return self.mapping(spec, value, path)
            return self.free_mapping(spec, value, path)
        if kind == "list":
            return self.sequence(spec, value, path)
        self.scalar(spec, value, path)
        return value

    def scalar(self, spec: Mapping[str, Any], value: Any, path: str) -> None:
        hint = spec.get("hint", "")
        if "choices" in spec and value not in spec["choices"]:
            self.error(path, value, "use one of: %s" % ", ".join(str(c) for c in spec["choices"]))
        if "pattern" in spec and isinstance(value, str) and not re.match(spec["pattern"], value):
            fix = suggest.explain_mismatch(re.split(r"[.\[]", path)[-1], spec, value)
            fix = (fix or hint.replace("{value}", value)).replace("{recipe}", self.name)
            self.error(path, value, fix or "it must match %s" % spec["pattern"])
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            low, high = spec.get("min"), spec.get("max")
            if (low is not None and value < low) or (high is not None and value > high):
                if hint:
                    fix = hint
                elif high is None:
                    fix = "it must be at least %s" % low
                else:
                    fix = "it must be between %s and %s" % (low, high)
                self.error(path, value, fix)

    def sequence(self, spec: Mapping[str, Any], value: List[Any], path: str) -> List[Any]:
        elements = spec.get("elements", "raw")
        item_spec = {k: v for k, v in spec.items() if k in ("min", "max", "hint", "choices", "pattern")}
        item_spec["type"] = elements
        if "options" in spec:
            item_spec["options"] = spec["options"]
            item_spec["one_of"] = spec.get("one_of", [])
        return [self.field(item_spec, item, "%s[%d]" % (path, i)) for i, item in enumerate(value)]

    def free_mapping(self, spec: Mapping[str, Any], value: Dict[Any, Any], path: str) -> Dict[Any, Any]:
        kind = spec.get("values", "raw")
        out: Dict[Any, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                self.error(_join(path, str(key)), key, "keys of %s must be strings; quote the key" % path)
                continue
            if not is_type(item, kind):
                self.error(_join(path, key), item, _type_fix(kind, item))
            out[key] = item
        return out

    def _flag_hint(self, path: str, kind: str) -> str:
        """For a section given a plain value whose name is also an engine flag (``host: 0.0.0.0``): its field."""
        key = re.split(r"[.\[]", path)[-1]
        home = suggest.flag_home(key, self.engine, self.flags_version) if kind == "dict" else None
        if home is None or not home.exact or not _is_field(home.field) or home.field.startswith(path + "."):
            return ""
        return "; if it is the %s flag --%s, set `%s` instead" % (home.engine, home.flag, home.field)

    def mapping(self, spec: Mapping[str, Any], value: Dict[Any, Any], path: str) -> Dict[str, Any]:
        options: Mapping[str, Any] = spec["options"]
        if not path:
            self.engine = value.get("engine")
            flags = value.get("engine_flags")
            self.flags_version = flags.get("version") if isinstance(flags, dict) else None
        for key in value:
            if key not in options:
                self.errors.append(unknown_key_error(self.name, path, str(key), value[key], options,
                                                     self.engine, self.flags_version))
        for group in spec.get("one_of", []):
            self.one_of(group, value, path)
        grouped = {key for group in spec.get("one_of", []) for key in group}
        for key in options:
            pair = [key, key + "_from"]
            if pair[1] in options and key not in grouped:
                given = [k for k in pair if value.get(k) is not None and _join(path, k) not in self.resolved]
                if len(given) == 2:
                    self.errors.append("recipe %s: %s and %s are both set; keep one of them."
                                       % (self.name, _join(path, key), _join(path, pair[1])))
        out: Dict[str, Any] = {}
        for key, sub in options.items():
            here = _join(path, key)
            item = value.get(key)
            if item is not None:
                out[key] = self.field(sub, item, here)
            elif sub.get("required"):
                self.errors.append("recipe %s: %s is missing; add it (%s)."
                                   % (self.name, here, _summary(sub.get("description", ""))))
                out[key] = None
            elif "default" in sub:
                out[key] = self.field(sub, copy.deepcopy(sub["default"]), here)
            else:
                out[key] = None
        for key, sub in options.items():
            template = sub.get("default_template")
            if template and out.get(key) is None:
                fields = [f for _, f, _, _ in string.Formatter().parse(template) if f]
                if all(isinstance(out.get(f), str) for f in fields):
                    out[key] = template.format(**{f: out[f] for f in fields})
        return out

    def one_of(self, group: List[str], value: Mapping[str, Any], path: str) -> None:
        given = [k for k in group if value.get(k) is not None and _join(path, k) not in self.resolved]
        if len(given) > 1:
            self.errors.append(
                "recipe %s: %s are all set; keep exactly one of them."
                % (self.name, " and ".join(_join(path, k) for k in given))
            )
        elif not given and not any(_join(path, k) in self.resolved for k in group):
            first = _join(path, group[0])
            self.errors.append(
                "recipe %s: %s is missing; set %s, or %s to the name of an inventory variable that holds it."
                % (self.name, first, first, _join(path, group[1]))
            )


def field_label(path: str, resolved: Mapping[str, str]) -> str:
    """A field's path, naming the variable it (or the field holding it) came from."""
    for source, variable in resolved.items():
        if path == source or path.startswith(source + ".") or path.startswith(source + "["):
            return "%s (from the variable %s)" % (path, variable)
    return path


def _fill(template: str, holder: Mapping[str, Any]) -> str:
    """``{field}`` replaced by the string value of that field of ``holder``, or by `field`."""
    def one(match: "re.Match[str]") -> str:
        value = holder.get(match.group(1))
        return value if isinstance(value, str) and value else match.group(1)
    return re.sub(r"\{([a-z_]+)\}", one, template)


def _from_pairs(spec: Mapping[str, Any]) -> List[Tuple[str, Mapping[str, Any]]]:
    """(KEY, spec of KEY_from) for every KEY of a mapping spec that may come from a variable."""
    options = spec.get("options") or {}
    return [(key, options[key + "_from"]) for key in options if key + "_from" in options]


_Visit = Callable[[Dict[str, Any], str, Mapping[str, Any], str], Dict[str, Any]]


def _walk_from(data: Any, spec: Mapping[str, Any], path: str, visit: _Visit) -> Any:
    """Call ``visit(holder, key, from_spec, path)`` for every KEY_from of ``data``; rebuild the mappings.

    ``visit`` returns the holder to go on with (a copy with KEY filled, say).
    Sub-mappings and mappings in lists are walked after their parent's own
    KEY_from fields, so that a list taken from a variable is walked too.
    """
    if not isinstance(data, dict) or "options" not in spec:
        return data
    holder = dict(data)
    for key, from_spec in _from_pairs(spec):
        holder = visit(holder, key, from_spec, path)
    for key, sub in spec["options"].items():
        value = holder.get(key)
        here = _join(path, key)
        if sub.get("type") == "dict" and isinstance(value, dict):
            holder[key] = _walk_from(value, sub, here, visit)
        elif sub.get("type") == "list" and "options" in sub and isinstance(value, list):
            item_spec = dict(sub, type="dict")
            holder[key] = [_walk_from(item, item_spec, "%s[%d]" % (here, i), visit) for i, item in enumerate(value)]
    return holder


def variables_named(data: Any) -> List[str]:
    """The inventory variables a loaded recipe's ``*_from`` fields name, in file order, each once.

    The caller passes their values as ``variables`` to validate_recipe (the
    recipe role takes exactly these from the inventory).
    """
    names: List[str] = []

    def visit(holder: Dict[str, Any], key: str, from_spec: Mapping[str, Any], path: str) -> Dict[str, Any]:
        variable = holder.get(key + "_from")
        if isinstance(variable, str) and re.match(_VARIABLE, variable) and variable not in names:
            names.append(variable)
        return holder

    _walk_from(data, RECIPE_SPEC, "", visit)
    return names


def _supply_of(data: Mapping[str, Any]) -> Dict[str, str]:
    supply = data.get("supply") if isinstance(data, Mapping) else None
    if not isinstance(supply, dict):
        return {}
    return {k: v.strip() for k, v in supply.items() if isinstance(k, str) and isinstance(v, str) and v.strip()}


def resolve(data: Dict[str, Any], name: str, variables: Mapping[str, Any],
             errors: List[str]) -> Tuple[Dict[str, Any], Dict[str, str]]:
    """Fill every KEY from its KEY_from variable; report each variable that is not set."""
    resolved: Dict[str, str] = {}
    supply = _supply_of(data)

    def visit(holder: Dict[str, Any], key: str, from_spec: Mapping[str, Any], path: str) -> Dict[str, Any]:
        variable = holder.get(key + "_from")
        if not isinstance(variable, str) or not re.match(_VARIABLE, variable) or holder.get(key) is not None:
            return holder  # a bad or doubled KEY_from is reported by the schema check
        if variables.get(variable) is None:
            wants = supply.get(variable) or _fill(from_spec.get("wants", "its value"), holder)
            errors.append("recipe %s: %s names the inventory variable %s, which is not set; set it to %s."
                          % (name, _join(path, key + "_from"), variable, wants.rstrip(".")))
            return holder
        holder[key] = copy.deepcopy(variables[variable])
        resolved[_join(path, key)] = variable
        return holder

    return _walk_from(data, RECIPE_SPEC, "", visit), resolved
