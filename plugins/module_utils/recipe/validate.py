"""A recipe checked against the schema (schema.py), its variables and the cluster it runs on.

``validate_recipe`` checks a loaded recipe and fills the defaults, resolving
each ``*_from`` field from the variables given (``variables_named`` lists
them); ``validate_for_cluster`` checks the result against the cluster it is
about to run on. Every problem is reported at once, each naming the field,
the bad value and the fix.

Pure standard library: this file also runs on the nodes, which have no
pyyaml. Callers load the YAML themselves (load.py reads a recipe file where PyYAML is).
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import re
import string
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple, TypeGuard, Union

from ansible_collections.sparkserve.deploy.plugins.module_utils.engines import ENGINES, known_flags
from ansible_collections.sparkserve.deploy.plugins.module_utils.recipe import suggest
from ansible_collections.sparkserve.deploy.plugins.module_utils.recipe.schema import (
    _CONTAINER_NAME,
    _ENV_NAME,
    _FLAG_NAME,
    _HEX64,
    _RELATIVE_PATH,
    _SHARD_SUFFIXES,
    _VARIABLE,
    RECIPE_SPEC,
)
from ansible_collections.sparkserve.deploy.plugins.module_utils.secrets import MASK, looks_like_token, looks_secret

_TOKEN_FIX = ("its value has the form of a credential (a Hugging Face, OpenAI, GitHub, AWS or Slack token), and a "
              "recipe is committed and printed: remove it from the recipe, and keep the Hugging Face token in "
              "Ansible Vault as weights_hf_token (ansible-vault encrypt_string --name weights_hf_token), which the "
              "weights stage uses, and any other secret in Vault too")
_TYPE_WORDS = {
    "str": "a string",
    "int": "an integer",
    "number": "a number",
    "bool": "true or false",
    "dict": "a mapping",
    "list": "a list",
}


# ---------------------------------------------------------------- messages

def _show(value: Any) -> str:
    try:
        return json.dumps(value, sort_keys=False)
    except (TypeError, ValueError):
        return repr(value)


def _message(name: str, path: str, value: Any, fix: str) -> str:
    # The value of a secret-looking env name or engine flag is never printed.
    parts = path.split(" ")[0].split(".", 1)
    secret = (parts[0] in ("env", "engine_args") and len(parts) == 2 and looks_secret(parts[1])) \
        or _holds_token(value)
    return "recipe %s: %s is %s; %s." % (name, path, MASK if secret else _show(value), fix.rstrip("."))


def _holds_token(value: Any) -> bool:
    """Whether VALUE, or anything in it, has the form of a credential."""
    try:
        return looks_like_token(value if isinstance(value, str) else json.dumps(value, default=str))
    except (TypeError, ValueError):
        return False


def _count(count: Any, noun: str) -> str:
    """``1 node``, ``2 nodes``."""
    return "%s %s%s" % (count, noun, "" if count == 1 else "s")


def _summary(description: str) -> str:
    """The first sentence of a field's description, without Markdown."""
    text = re.sub(r"\s*\(see [^)]*\)", "", description).replace("`", "").replace("*", "")
    return text.split(". ")[0].rstrip(".")


def _join(path: str, key: str) -> str:
    return "%s.%s" % (path, key) if path else key


# ---------------------------------------------------------------- checking

def _is_type(value: Any, kind: str) -> bool:
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


def _is_number(value: object) -> TypeGuard[Union[int, float]]:
    """_is_type(value, "number"), telling the type checker so."""
    return _is_type(value, "number")


def _is_count(value: object) -> TypeGuard[int]:
    """An int (not a bool) above zero."""
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _type_fix(kind: str, value: Any) -> str:
    fix = "it must be %s" % _TYPE_WORDS.get(kind, kind)
    if kind == "str" and isinstance(value, (bool, int, float)):
        fix += ' (quote it: YAML reads bare yes, no, on, off and numbers as non-strings)'
    return fix


class _Checker:
    """Walks a value against a field spec, collecting messages."""

    def __init__(self, name: str, resolved: Mapping[str, str]) -> None:
        self.name = name
        self.resolved = resolved  # dotted path -> variable it was taken from
        self.errors: List[str] = []

    def label(self, path: str) -> str:
        return _label(path, self.resolved)

    def error(self, path: str, value: Any, fix: str) -> None:
        self.errors.append(_message(self.name, self.label(path), value, fix))

    def field(self, spec: Mapping[str, Any], value: Any, path: str) -> Any:
        kind = spec.get("type", "raw")
        if not _is_type(value, kind):
            self.error(path, value, _type_fix(kind, value))
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
            self.error(path, value, fix or hint.replace("{value}", value) or "it must match %s" % spec["pattern"])
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
            if not _is_type(item, kind):
                self.error(_join(path, key), item, _type_fix(kind, item))
            out[key] = item
        return out

    def mapping(self, spec: Mapping[str, Any], value: Dict[Any, Any], path: str) -> Dict[str, Any]:
        options: Mapping[str, Any] = spec["options"]
        for key in value:
            if key not in options:
                where = path or "a recipe"
                near = suggest.suggest_fields(str(key), path)
                fix = ("did you mean %s? (the fields are in recipes/README.md)"
                       % " or ".join("`%s`" % n for n in near) if near
                       else "use one of: %s (see recipes/README.md)" % ", ".join(options))
                self.errors.append("recipe %s: %s is not a field of %s; %s."
                                   % (self.name, _join(path, str(key)), where, fix.rstrip(".")))
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


def _label(path: str, resolved: Mapping[str, str]) -> str:
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


def _resolve(data: Dict[str, Any], name: str, variables: Mapping[str, Any],
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


# ---------------------------------------------------------------- public API

def validate_recipe(data: Dict[str, Any], name: str,
                    variables: Optional[Mapping[str, Any]] = None,
                    recipes_dir: Optional[str] = None) -> Tuple[Dict[str, Any], List[str]]:
    """Check a loaded recipe; return it with defaults filled, and every problem found.

    ``variables`` resolves every ``*_from`` field (``image_from``,
    ``model.revision_from``, ``overlays_from``, ...): each names a variable
    whose value is put in the field beside it and checked like it; a variable
    that is not set is reported, with what to set it to. Without ``variables``
    the ``*_from`` fields are only checked for form. With ``recipes_dir`` the
    files the recipe names (``overlays[].patch``, ``file_overrides[].source``)
    must be in that folder, and each override must have its sha256.
    """
    errors: List[str] = []
    if not isinstance(data, dict):
        return {}, [_message(name, "the recipe", data, "it must be a YAML mapping of the fields in recipes/README.md")]
    resolved: Dict[str, str] = {}
    if variables is not None:
        data, resolved = _resolve(data, name, variables, errors)
    checker = _Checker(name, resolved)
    recipe = checker.mapping(RECIPE_SPEC, data, "")
    errors.extend(checker.errors)
    errors.extend(_cross_checks(recipe, name, data))
    if recipes_dir is not None:
        errors.extend(_file_checks(recipe, name, recipes_dir, resolved))
    return recipe, errors


def _named_files(recipe: Mapping[str, Any]) -> List[Tuple[str, Any, Optional[Any]]]:
    """(path of the field, file named, expected sha256 or None) of every file of the recipes folder."""
    files: List[Tuple[str, Any, Optional[Any]]] = []
    overlays = recipe.get("overlays") if isinstance(recipe, Mapping) else None
    if _section(recipe, "overlays_repo"):
        overlays = None  # the patches are files of the pinned overlays repository, checked by its manifest
    for i, overlay in enumerate(overlays if isinstance(overlays, list) else []):
        if isinstance(overlay, dict):
            files.append(("overlays[%d].patch" % i, overlay.get("patch"), None))
    for section in ("model", "draft_model"):
        overrides = _section(recipe, section).get("file_overrides")
        for i, item in enumerate(overrides if isinstance(overrides, list) else []):
            if isinstance(item, dict):
                files.append(("%s.file_overrides[%d].source" % (section, i), item.get("source"), item.get("sha256")))
    return files


def _sha256_file(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 16), b""):
            digest.update(block)
    return digest.hexdigest()


def _file_checks(recipe: Dict[str, Any], name: str, recipes_dir: str, resolved: Mapping[str, str]) -> List[str]:
    """Every file the recipe names is in the recipes folder, with its sha256 where one is given."""
    errors: List[str] = []
    supply = _section(recipe, "supply")
    for path, rel, sha256 in _named_files(recipe):
        if not isinstance(rel, str) or not re.match(_RELATIVE_PATH, rel):
            continue  # reported by the schema check
        full = os.path.join(recipes_dir, rel)
        if not os.path.isfile(full):
            supplied = supply.get(rel)
            where = supplied if isinstance(supplied, str) else ""
            errors.append("recipe %s: %s names %s, which is not in the recipes folder (%s); put the file there%s."
                          % (name, _label(path, resolved), _show(rel), recipes_dir,
                             (": " + where.strip().rstrip(".")) if where.strip() else ""))
            continue
        if isinstance(sha256, str) and re.match(_HEX64, sha256):
            actual = _sha256_file(full)
            if actual != sha256:
                errors.append("recipe %s: %s names %s, whose sha256 is %s, not the %s given in %s; put the right "
                              "file there or correct the hash."
                              % (name, _label(path, resolved), _show(rel), actual, sha256,
                                 _label(path.rsplit(".", 1)[0] + ".sha256", resolved)))
    errors.extend(_expectation_checks(recipe, name, recipes_dir))
    return errors


def _expectation_checks(recipe: Mapping[str, Any], name: str, recipes_dir: str) -> List[str]:
    """Each file override's source holds what its ``expect`` says (read here, on the controller)."""
    errors: List[str] = []
    for section in ("model", "draft_model"):
        overrides = _section(recipe, section).get("file_overrides")
        for i, item in enumerate(overrides if isinstance(overrides, list) else []):
            expect = item.get("expect") if isinstance(item, dict) else None
            source = item.get("source") if isinstance(item, dict) else None
            if not isinstance(expect, dict) or not expect or not isinstance(source, str) \
                    or not re.match(_RELATIVE_PATH, source):
                continue
            full = os.path.join(recipes_dir, source)
            if not os.path.isfile(full):
                continue  # reported with the other named files
            with open(full, "rb") as handle:
                content = handle.read()
            override = "%s.file_overrides[%d]" % (section, i)
            for problem in file_expectation_problems(content, expect):
                errors.append("recipe %s: %s (%s): %s; put the right file at %s or correct %s.expect."
                              % (name, override, item.get("path"), problem, source, override))
    return errors


def _same_json(left: Any, right: Any) -> bool:
    """Equal as JSON values: true is not 1, 1 is 1.0, "1" is not 1; lists and objects compared item by item."""
    if isinstance(left, bool) or isinstance(right, bool):
        return isinstance(left, bool) and isinstance(right, bool) and left == right
    if isinstance(left, (int, float)) and isinstance(right, (int, float)):
        return left == right
    if isinstance(left, list) and isinstance(right, list):
        return len(left) == len(right) and all(_same_json(a, b) for a, b in zip(left, right, strict=True))
    if isinstance(left, dict) and isinstance(right, dict):
        return left.keys() == right.keys() and all(_same_json(left[k], right[k]) for k in left)
    return type(left) is type(right) and left == right


def file_expectation_problems(content: Union[str, bytes], expect: Mapping[str, Any]) -> List[str]:
    """What the JSON file CONTENT fails of EXPECT (top-level key -> value), one phrase each; [] when it holds all.

    Where the file's value is a list, the expected value (one value, or a list
    of values) must all be in it: ``eos_token_id is [2], it must include 3``.
    Otherwise the two must be equal: ``temperature is 0.7, it must be 0.6``.
    """
    keys = ", ".join(str(key) for key in expect)
    try:
        data = json.loads(content)
    except ValueError as exc:  # json.JSONDecodeError and UnicodeDecodeError both are
        return ["the source is not JSON (%s), so it holds no %s" % (exc, keys)]
    if not isinstance(data, dict):
        return ["the source holds %s, not a JSON object, so it holds no %s"
                % (_TYPE_WORDS["list"] if isinstance(data, list) else _show(data), keys)]
    problems: List[str] = []
    for key, wanted in expect.items():
        wanted_items = wanted if isinstance(wanted, list) else [wanted]
        if key not in data:
            problems.append("%s is missing, it must hold %s" % (key, _show(wanted)))
            continue
        held = data[key]
        if isinstance(held, list):
            if not all(any(_same_json(item, one) for item in held) for one in wanted_items):
                problems.append("%s is %s, it must include %s%s"
                                % (key, _show(held), "all of " if isinstance(wanted, list) else "", _show(wanted)))
        elif not _same_json(held, wanted):
            problems.append("%s is %s, it must be %s" % (key, _show(held), _show(wanted)))
    return problems


def _section(recipe: Mapping[str, Any], key: str) -> Dict[str, Any]:
    value = recipe.get(key) if isinstance(recipe, Mapping) else None
    return value if isinstance(value, dict) else {}


def _cross_checks(recipe: Dict[str, Any], name: str, data: Mapping[str, Any]) -> List[str]:
    errors: List[str] = []
    if isinstance(recipe.get("name"), str) and recipe["name"] != name:
        errors.append(_message(name, "name", recipe["name"],
                               "make it %s, the name the recipe is loaded under (recipes/%s.yml)"
                               % (_show(name), name)))

    launch = _section(recipe, "launch")
    ports: List[Tuple[str, Any]] = [("launch.api_port", launch.get("api_port")),
                                    ("launch.master_port", launch.get("master_port"))]
    extra = launch.get("extra_ports")
    if isinstance(extra, list):
        ports += [("launch.extra_ports[%d]" % i, p) for i, p in enumerate(extra)]
    seen: Dict[Any, str] = {}
    for path, port in ports:
        if not isinstance(port, int) or isinstance(port, bool):
            continue
        if port in seen:
            errors.append(_message(name, path, port, "it is already %s; give every port of the deployment "
                                   "a different number" % seen[port]))
        else:
            seen[port] = path

    pattern = launch.get("container_name")
    if isinstance(pattern, str):
        try:
            fields = [f for _, f, _, _ in string.Formatter().parse(pattern) if f is not None]
        except ValueError:
            fields = ["?"]
        if any(f not in ("deployment", "rank") for f in fields) or "rank" not in fields:
            errors.append(_message(name, "launch.container_name", pattern,
                                   "use only {deployment} and {rank}, and include {rank}, "
                                   "as in {deployment}-rank{rank}"))
        else:
            sample = pattern.format(deployment="d", rank=0)
            if not _CONTAINER_NAME.match(sample):
                errors.append(_message(name, "launch.container_name", pattern,
                                       "a container name may hold only letters, digits, _ . and -, "
                                       "and must start with a letter or digit"))

    engine = recipe.get("engine")
    adapter = ENGINES.get(engine) if isinstance(engine, str) else None
    errors.extend(_check_engine_args(recipe, name, adapter))

    env = recipe.get("env")
    if isinstance(env, dict):
        for key in env:
            if isinstance(key, str) and not _ENV_NAME.match(key):
                errors.append(_message(name, "env key", key,
                                       "an environment variable name holds letters, digits and _, "
                                       "and does not start with a digit"))
            elif adapter is not None and key == adapter.host_ip_variable:
                errors.append(_message(name, "env.%s" % key, env[key],
                                       "the fabric stage sets %s on each node to the node's own fabric address "
                                       "(sparkserve_fabric_ip); remove it from env" % key))
            elif looks_secret(key):
                errors.append(_message(name, "env.%s" % key, env[key],
                                       "its name says it holds a secret (a TOKEN, KEY, SECRET or PASSWORD), and a "
                                       "recipe is committed and printed: remove it from the recipe, and keep the "
                                       "Hugging Face token in Ansible Vault as weights_hf_token (ansible-vault "
                                       "encrypt_string --name weights_hf_token), which the weights stage uses, and "
                                       "any other secret in Vault too"))
            elif looks_like_token(env[key]):
                errors.append(_message(name, "env.%s" % key, env[key], _TOKEN_FIX))

    if adapter is not None:
        errors.extend(_message(name, path, value, fix) for path, value, fix in adapter.problems(recipe))

    memory = _section(recipe, "memory")
    guard = _section(memory, "guard")
    floor, gate = guard.get("floor_gib"), memory.get("min_available_gib")
    if _is_number(floor) and _is_number(gate) and floor >= gate:
        errors.append(_message(name, "memory.guard.floor_gib", floor,
                               "it must be below memory.min_available_gib (%s), or the guard stops ranks "
                               "the gate lets start; lower the floor or raise the gate" % _show(gate)))

    bench = _section(recipe, "bench")
    qualify = bench.get("qualify_suite")
    if isinstance(qualify, str):
        suites = [s.get("name") for s in bench.get("suites") or [] if isinstance(s, dict)]
        if qualify not in suites:
            errors.append(_message(name, "bench.qualify_suite", qualify,
                                   "name one of bench.suites (%s), or add a suite of that name"
                                   % (", ".join(str(s) for s in suites) or "none yet")))

    model = _section(recipe, "model")
    draft = _section(recipe, "draft_model")
    if draft and draft.get("path_in_container") and draft.get("path_in_container") == model.get("path_in_container"):
        errors.append(_message(name, "draft_model.path_in_container", draft["path_in_container"],
                               "it is model.path_in_container too; mount the draft somewhere else"))
    for section, part in (("model", model), ("draft_model", draft)):
        errors.extend(_check_file_overrides(name, section, part.get("file_overrides")))
    errors.extend(_check_supply(recipe, name, data))
    return errors


def _flag_list(recipe: Mapping[str, Any], name: str, engine: str,
               errors: List[str]) -> Optional[known_flags.FlagList]:
    """The flag list engine_flags.version names (default the newest shipped); None, with the error, if none."""
    wanted = _section(recipe, "engine_flags").get("version")
    version = wanted if isinstance(wanted, str) and wanted else known_flags.newest(engine)
    if version is None:
        return None
    try:
        return known_flags.load(engine, version)
    except FileNotFoundError:
        shipped = known_flags.versions(engine)
        errors.append(_message(name, "engine_flags.version", version,
                               "sparkserve ships the flags of %s %s only; name the one closest to the version the "
                               "image carries, or list the image's own flags into "
                               "plugins/module_utils/engines/flags/%s-%s.json with: docker run --rm -i --entrypoint "
                               "python3 IMAGE - %s < tools/engine-flags.py"
                               % (engine, " and ".join(shipped) or "no version", engine, version, engine)))
    except ValueError as error:
        errors.append(_message(name, "engine_flags.version", version,
                               "%s; write it again with tools/engine-flags.py" % error))
    return None


def _check_engine_args(recipe: Mapping[str, Any], name: str, adapter: Any) -> List[str]:
    """engine_args keys: no dashes, not a flag sparkserve sets, one the engine's parser has, of the right kind."""
    errors: List[str] = []
    args = recipe.get("engine_args")
    if not isinstance(args, dict):
        return errors
    owned = adapter.owned_flags if adapter is not None else {}
    listed = _flag_list(recipe, name, adapter.name, errors) if adapter is not None else None
    adds = _section(recipe, "engine_flags").get("image_adds") or []
    image_adds = {flag.replace("_", "-") for flag in adds if isinstance(flag, str)}
    for key, value in args.items():
        if not isinstance(key, str):
            continue
        path = "engine_args.%s" % key
        if key.startswith("-"):
            errors.append(_message(name, "engine_args key", key,
                                   "write it without leading dashes: %s" % key.lstrip("-")))
            continue
        if not _FLAG_NAME.match(key):
            errors.append(_message(name, "engine_args key", key,
                                   "a flag name holds only letters, digits, _ . and -"))
            continue
        flag = key.replace("_", "-")
        if flag in owned:
            errors.append(_message(name, path, value,
                                   "sparkserve sets --%s from %s; remove it from engine_args"
                                   % (flag, owned[flag])))
            continue
        # vLLM reads --speculative-config.method as a field of the JSON flag --speculative-config.
        base = flag.split(".", 1)[0]
        kind = listed.flags.get(base) if listed is not None else None
        if kind is None and base not in image_adds:
            near = suggest.near_owned_flag(flag, owned)
            if near:
                field = owned[near]
                meant = field.split(".")[0] in RECIPE_SPEC["options"]
                errors.append(_message(name, path, value, "it is one letter off --%s, which sparkserve sets itself "
                                       "from %s: %s" % (near, field, "did you mean `%s`? Set that field and remove "
                                                        "this key from engine_args" % field if meant else
                                                        "remove this key from engine_args")))
                continue
            if listed is not None:
                errors.append(_message(name, path, value, _unknown_flag_fix(base, listed, owned)))
                continue
        elif kind is not None and "." not in flag:
            wrong = _wrong_kind(kind, value, base, listed)
            if wrong:
                errors.append(_message(name, path, value, wrong))
                continue
        errors.extend(_check_arg_value(name, path, value))
    return errors


def _unknown_flag_fix(flag: str, listed: known_flags.FlagList, owned: Mapping[str, str]) -> str:
    """What to do about FLAG, which LISTED does not have: write it in full, the close match, or image_adds."""
    near = suggest.near_flags(flag, listed.flags)
    where = "%s %s's parser (%s)" % (listed.engine, listed.version, listed.file)
    if len(near) == 1 and near[0].startswith(flag):
        full = near[0]
        if full in owned:
            return "it abbreviates --%s, which sparkserve sets itself from %s; remove it from engine_args" % (
                full, owned[full])
        return ("it abbreviates --%s of %s; write it in full (an abbreviation changes meaning when the engine "
                "adds a flag with the same start)" % (full, where))
    meant = " or ".join("--%s%s" % (n, " (sparkserve sets it from %s)" % owned[n] if n in owned else "")
                        for n in near)
    return "%s%s has no --%s; if the image adds it (a patched image), list it under engine_flags.image_adds" % (
        "did you mean %s? " % meant if near else "", where, flag)


def _wrong_kind(kind: str, value: Any, flag: str, listed: Optional[known_flags.FlagList]) -> str:
    """Why VALUE cannot go with FLAG of KIND (a switch takes true or false, a value flag no bare true)."""
    where = "%s %s" % (listed.engine, listed.version) if listed is not None else "the engine"
    if kind == known_flags.SWITCH and value is not None and not isinstance(value, bool):
        return "--%s is a switch in %s: write true to set it, false or null to leave it out" % (flag, where)
    if kind == known_flags.VALUE and value is True:
        return "--%s takes a value in %s: true would pass the flag alone; give its value" % (flag, where)
    return ""


def _check_file_overrides(name: str, section: str, overrides: Any) -> List[str]:
    errors: List[str] = []
    seen: Dict[str, str] = {}
    for i, item in enumerate(overrides if isinstance(overrides, list) else []):
        target = item.get("path") if isinstance(item, dict) else None
        if not isinstance(target, str) or not re.match(_RELATIVE_PATH, target):
            continue
        path = "%s.file_overrides[%d].path" % (section, i)
        norm = "/".join(part for part in target.split("/") if part not in ("", "."))
        if norm.lower().endswith(_SHARD_SUFFIXES):
            errors.append(_message(name, path, target, "weight shards are never replaced; override only small "
                                                       "files such as generation_config.json"))
        elif norm in seen:
            errors.append(_message(name, path, target, "it is already %s; override each file once" % seen[norm]))
        else:
            seen[norm] = path
    for i, item in enumerate(overrides if isinstance(overrides, list) else []):
        expect = item.get("expect") if isinstance(item, dict) else None
        for key, wanted in (expect.items() if isinstance(expect, dict) else ()):
            values = wanted if isinstance(wanted, list) else [wanted]
            if not all(value is None or isinstance(value, (str, int, float, bool)) for value in values):
                errors.append(_message(name, "%s.file_overrides[%d].expect.%s" % (section, i, key), wanted,
                                       "give a string, a number, true, false or null, or a list of them"))
    return errors


def _check_supply(recipe: Mapping[str, Any], name: str, data: Mapping[str, Any]) -> List[str]:
    """Every entry of supply names a variable of a *_from field or a file of the recipe."""
    supply = recipe.get("supply")
    if not isinstance(supply, dict):
        return []
    known = set(variables_named(data)) | {rel for _, rel, _ in _named_files(recipe) if isinstance(rel, str)}
    errors: List[str] = []
    for key, text in supply.items():
        if not isinstance(key, str):
            continue
        if key not in known:
            errors.append(_message(name, "supply key", key,
                                   "it names no variable of a *_from field and no file of the recipe; "
                                   "name one of: %s" % (", ".join(sorted(known)) or "none (remove supply)")))
        elif isinstance(text, str) and not text.strip():
            errors.append(_message(name, "supply.%s" % key, text, "say where the user finds the value"))
    return errors


def _check_arg_value(name: str, path: str, value: Any) -> List[str]:
    if _holds_token(value):
        return [_message(name, path, value, _TOKEN_FIX)]
    scalar = (str, int, float, bool)
    if value is None or isinstance(value, scalar):
        return []
    if isinstance(value, list):
        if all(isinstance(v, scalar) for v in value):
            return []
        return [_message(name, path, value, "a list value may hold only strings, numbers and booleans; "
                                            "give a mapping to pass JSON")]
    if isinstance(value, dict):
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            return [_message(name, path, value, "the mapping must be plain JSON data")]
        return []
    return [_message(name, path, value, "give a string, a number, true, false, null, a list or a mapping")]


def validate_for_cluster(recipe: Dict[str, Any], name: str, world_size: int,
                         hf_token_present: bool) -> List[str]:
    """Check a validated recipe against the cluster it is about to run on."""
    errors: List[str] = []
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        return ["recipe %s: the cluster has %s; deploy on at least one node (sparkserve_world_size)."
                % (name, _count(_show(world_size), "node"))]
    parallel = _section(recipe, "parallel")
    tensor, pipeline = parallel.get("tensor"), parallel.get("pipeline", 1)
    per_node = parallel.get("gpus_per_node", 1)
    if _is_count(tensor) and _is_count(pipeline) and _is_count(per_node):
        want, have = tensor * pipeline, world_size * per_node
        if want != have:
            errors.append(
                "recipe %s: parallel.tensor × parallel.pipeline is %d × %d = %s but the cluster has "
                "%s × parallel.gpus_per_node %d = %s; make the two equal, by changing "
                "parallel.tensor or by deploying on %s."
                % (name, tensor, pipeline, _count(want, "GPU"), _count(world_size, "node"), per_node,
                   _count(have, "GPU"),
                   _count(want // per_node, "node") if want % per_node == 0 else "a matching number of nodes")
            )
    for key, value in _section(recipe, "engine_args").items():
        if isinstance(key, str) and key.replace("_", "-") == "load-format" and value == "instanttensor" \
                and world_size > 1:
            errors.append(_message(name, "engine_args.%s" % key, value,
                                   "instanttensor loads made ranks die silently on more than one node "
                                   "(seed 000); remove it for this %d-node deployment" % world_size))
    if not hf_token_present:
        for section in ("model", "draft_model", "overlays_repo"):
            part = _section(recipe, section)
            if part.get("gated") is True:
                errors.append(
                    "recipe %s: %s.gated is true for %s and no Hugging Face token is configured; put the token "
                    "in the Ansible Vault variable weights_hf_token, or export HF_TOKEN where the playbook runs."
                    % (name, section, _show(part.get("repo")))
                )
    return errors
