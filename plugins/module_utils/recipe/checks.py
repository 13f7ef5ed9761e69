"""The checks of a recipe beyond the schema: across fields, engine flags, named files, the cluster.

``cross_checks`` runs after the schema walk (walk.py): the name matches the
file, ports differ, the container name pattern, ``engine_args`` against the
engine's flag list (flags sparkserve sets, abbreviations, switches and
values, credentials), ``env`` names, the memory guard below the gate, the
qualifying suite, the draft's mount, file overrides and ``supply``.
``file_checks`` reads the files the recipe names in the recipes folder (their
presence, sha256 and ``expect``), and ``cluster_checks`` the recipe against
the cluster it is about to run on (GPUs, loaders, gated repositories).

Pure standard library: this file also runs on the nodes.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import string
from typing import Any, Dict, List, Mapping, Optional, Tuple, TypeGuard, Union

from ansible_collections.sparkserve.deploy.plugins.module_utils.engines import ENGINES, known_flags
from ansible_collections.sparkserve.deploy.plugins.module_utils.recipe import suggest
from ansible_collections.sparkserve.deploy.plugins.module_utils.recipe.schema import (
    _CONTAINER_NAME,
    _ENV_NAME,
    _FLAG_NAME,
    _HEX64,
    _RELATIVE_PATH,
    _SHARD_SUFFIXES,
    RECIPE_SPEC,
)
from ansible_collections.sparkserve.deploy.plugins.module_utils.recipe.walk import (
    TYPE_WORDS,
    field_label,
    holds_token,
    is_type,
    message,
    show,
    variables_named,
)
from ansible_collections.sparkserve.deploy.plugins.module_utils.secrets import looks_like_token, looks_secret

_TOKEN_FIX = ("its value has the form of a credential (a Hugging Face, OpenAI, GitHub, AWS or Slack token), and a "
              "recipe is committed and printed: remove it from the recipe, and keep the Hugging Face token in "
              "Ansible Vault as weights_hf_token (ansible-vault encrypt_string --name weights_hf_token), which the "
              "weights stage uses, and any other secret in Vault too")


def _count(count: Any, noun: str) -> str:
    """``1 node``, ``2 nodes``."""
    return "%s %s%s" % (count, noun, "" if count == 1 else "s")


def _is_number(value: object) -> TypeGuard[Union[int, float]]:
    """is_type(value, "number"), telling the type checker so."""
    return is_type(value, "number")


def _is_count(value: object) -> TypeGuard[int]:
    """An int (not a bool) above zero."""
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


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


def file_checks(recipe: Dict[str, Any], name: str, recipes_dir: str, resolved: Mapping[str, str]) -> List[str]:
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
                          % (name, field_label(path, resolved), show(rel), recipes_dir,
                             (": " + where.strip().rstrip(".")) if where.strip() else ""))
            continue
        if isinstance(sha256, str) and re.match(_HEX64, sha256):
            actual = _sha256_file(full)
            if actual != sha256:
                errors.append("recipe %s: %s names %s, whose sha256 is %s, not the %s given in %s; put the right "
                              "file there or correct the hash."
                              % (name, field_label(path, resolved), show(rel), actual, sha256,
                                 field_label(path.rsplit(".", 1)[0] + ".sha256", resolved)))
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
                % (TYPE_WORDS["list"] if isinstance(data, list) else show(data), keys)]
    problems: List[str] = []
    for key, wanted in expect.items():
        wanted_items = wanted if isinstance(wanted, list) else [wanted]
        if key not in data:
            problems.append("%s is missing, it must hold %s" % (key, show(wanted)))
            continue
        held = data[key]
        if isinstance(held, list):
            if not all(any(_same_json(item, one) for item in held) for one in wanted_items):
                problems.append("%s is %s, it must include %s%s"
                                % (key, show(held), "all of " if isinstance(wanted, list) else "", show(wanted)))
        elif not _same_json(held, wanted):
            problems.append("%s is %s, it must be %s" % (key, show(held), show(wanted)))
    return problems


def _section(recipe: Mapping[str, Any], key: str) -> Dict[str, Any]:
    value = recipe.get(key) if isinstance(recipe, Mapping) else None
    return value if isinstance(value, dict) else {}


def cross_checks(recipe: Dict[str, Any], name: str, data: Mapping[str, Any]) -> List[str]:
    errors: List[str] = []
    if isinstance(recipe.get("name"), str) and recipe["name"] != name:
        errors.append(message(name, "name", recipe["name"],
                               "make it %s, the name the recipe is loaded under (recipes/%s.yml)"
                               % (show(name), name)))

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
            errors.append(message(name, path, port, "it is already %s; give every port of the deployment "
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
            errors.append(message(name, "launch.container_name", pattern,
                                   "use only {deployment} and {rank}, and include {rank}, "
                                   "as in {deployment}-rank{rank}"))
        else:
            sample = pattern.format(deployment="d", rank=0)
            if not _CONTAINER_NAME.match(sample):
                errors.append(message(name, "launch.container_name", pattern,
                                       "a container name may hold only letters, digits, _ . and -, "
                                       "and must start with a letter or digit"))

    engine = recipe.get("engine")
    adapter = ENGINES.get(engine) if isinstance(engine, str) else None
    errors.extend(_check_engine_args(recipe, name, adapter))

    env = recipe.get("env")
    if isinstance(env, dict):
        for key in env:
            if isinstance(key, str) and not _ENV_NAME.match(key):
                errors.append(message(name, "env key", key,
                                       "an environment variable name holds letters, digits and _, "
                                       "and does not start with a digit"))
            elif adapter is not None and key == adapter.host_ip_variable:
                errors.append(message(name, "env.%s" % key, env[key],
                                       "the fabric stage sets %s on each node to the node's own fabric address "
                                       "(sparkserve_fabric_ip); remove it from env" % key))
            elif looks_secret(key):
                errors.append(message(name, "env.%s" % key, env[key],
                                       "its name says it holds a secret (a TOKEN, KEY, SECRET or PASSWORD), and a "
                                       "recipe is committed and printed: remove it from the recipe, and keep the "
                                       "Hugging Face token in Ansible Vault as weights_hf_token (ansible-vault "
                                       "encrypt_string --name weights_hf_token), which the weights stage uses, and "
                                       "any other secret in Vault too"))
            elif looks_like_token(env[key]):
                errors.append(message(name, "env.%s" % key, env[key], _TOKEN_FIX))

    if adapter is not None:
        errors.extend(message(name, path, value, fix) for path, value, fix in adapter.problems(recipe))

    memory = _section(recipe, "memory")
    guard = _section(memory, "guard")
    floor, gate = guard.get("floor_gib"), memory.get("min_available_gib")
    if _is_number(floor) and _is_number(gate) and floor >= gate:
        errors.append(message(name, "memory.guard.floor_gib", floor,
                               "it must be below memory.min_available_gib (%s), or the guard stops ranks "
                               "the gate lets start; lower the floor or raise the gate" % show(gate)))

    bench = _section(recipe, "bench")
    qualify = bench.get("qualify_suite")
    if isinstance(qualify, str):
        suites = [s.get("name") for s in bench.get("suites") or [] if isinstance(s, dict)]
        if qualify not in suites:
            errors.append(message(name, "bench.qualify_suite", qualify,
                                   "name one of bench.suites (%s), or add a suite of that name"
                                   % (", ".join(str(s) for s in suites) or "none yet")))

    model = _section(recipe, "model")
    aliases = model.get("aliases")
    if isinstance(aliases, list):
        names = [model.get("served_name")]
        for index, alias in enumerate(aliases):
            if alias in names:
                errors.append(message(name, "model.aliases[%d]" % index, alias,
                                       "it is %s already; give each name once"
                                       % ("model.served_name" if alias == names[0] else "an alias")))
            names.append(alias)
    draft = _section(recipe, "draft_model")
    if draft and draft.get("path_in_container") and draft.get("path_in_container") == model.get("path_in_container"):
        errors.append(message(name, "draft_model.path_in_container", draft["path_in_container"],
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
        errors.append(message(name, "engine_flags.version", version,
                               "sparkserve ships the flags of %s %s only; name the one closest to the version the "
                               "image carries, or list the image's own flags into "
                               "plugins/module_utils/engines/flags/%s-%s.json with: docker run --rm -i --entrypoint "
                               "python3 IMAGE - %s < tools/engine-flags.py"
                               % (engine, " and ".join(shipped) or "no version", engine, version, engine)))
    except ValueError as error:
        errors.append(message(name, "engine_flags.version", version,
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
            errors.append(message(name, "engine_args key", key,
                                   "write it without leading dashes: %s" % key.lstrip("-")))
            continue
        if not _FLAG_NAME.match(key):
            errors.append(message(name, "engine_args key", key,
                                   "a flag name holds only letters, digits, _ . and -"))
            continue
        flag = key.replace("_", "-")
        if flag in owned:
            errors.append(message(name, path, value,
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
                errors.append(message(name, path, value, "it is one letter off --%s, which sparkserve sets itself "
                                       "from %s: %s" % (near, field, "did you mean `%s`? Set that field and remove "
                                                        "this key from engine_args" % field if meant else
                                                        "remove this key from engine_args")))
                continue
            if listed is not None:
                errors.append(message(name, path, value, _unknown_flag_fix(base, listed, owned)))
                continue
        elif kind is not None and "." not in flag:
            wrong = _wrong_kind(kind, value, base, listed)
            if wrong:
                errors.append(message(name, path, value, wrong))
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
            errors.append(message(name, path, target, "weight shards are never replaced; override only small "
                                                       "files such as generation_config.json"))
        elif norm in seen:
            errors.append(message(name, path, target, "it is already %s; override each file once" % seen[norm]))
        else:
            seen[norm] = path
    for i, item in enumerate(overrides if isinstance(overrides, list) else []):
        expect = item.get("expect") if isinstance(item, dict) else None
        for key, wanted in (expect.items() if isinstance(expect, dict) else ()):
            values = wanted if isinstance(wanted, list) else [wanted]
            if not all(value is None or isinstance(value, (str, int, float, bool)) for value in values):
                errors.append(message(name, "%s.file_overrides[%d].expect.%s" % (section, i, key), wanted,
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
            errors.append(message(name, "supply key", key,
                                   "it names no variable of a *_from field and no file of the recipe; "
                                   "name one of: %s" % (", ".join(sorted(known)) or "none (remove supply)")))
        elif isinstance(text, str) and not text.strip():
            errors.append(message(name, "supply.%s" % key, text, "say where the user finds the value"))
    return errors


def _check_arg_value(name: str, path: str, value: Any) -> List[str]:
    if holds_token(value):
        return [message(name, path, value, _TOKEN_FIX)]
    scalar = (str, int, float, bool)
    if value is None or isinstance(value, scalar):
        return []
    if isinstance(value, list):
        if all(isinstance(v, scalar) for v in value):
            return []
        return [message(name, path, value, "a list value may hold only strings, numbers and booleans; "
                                            "give a mapping to pass JSON")]
    if isinstance(value, dict):
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            return [message(name, path, value, "the mapping must be plain JSON data")]
        return []
    return [message(name, path, value, "give a string, a number, true, false, null, a list or a mapping")]


def cluster_checks(recipe: Dict[str, Any], name: str, world_size: int, hf_token_present: bool) -> List[str]:
    """Check a validated recipe against the cluster it is about to run on."""
    errors: List[str] = []
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        return ["recipe %s: the cluster has %s; deploy on at least one node (sparkserve_world_size)."
                % (name, _count(show(world_size), "node"))]
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
            errors.append(message(name, "engine_args.%s" % key, value,
                                   "instanttensor loads made ranks die silently on more than one node "
                                   "(seed 000); remove it for this %d-node deployment" % world_size))
    if not hf_token_present:
        for section in ("model", "draft_model", "overlays_repo"):
            part = _section(recipe, section)
            if part.get("gated") is True:
                errors.append(
                    "recipe %s: %s.gated is true for %s and no Hugging Face token is configured; put the token "
                    "in the Ansible Vault variable weights_hf_token, or export HF_TOKEN where the playbook runs."
                    % (name, section, show(part.get("repo")))
                )
    return errors
