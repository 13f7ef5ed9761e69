"""`sparkserve recipe import|pin`: recipes people bring, and the pins they leave floating. Controller only."""

from __future__ import annotations

import argparse
import os
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any

import yaml

from sparkserve.project import UsageError
from sparkserve.recipe_pin import DEFAULT_HUB, Credentials, PinError, Resolver, apply, diff, plan
from sparkserve.summary import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK

ACTIONS = {
    "import": "write a sparkserve recipe for each recipe of the field's formats (sparkrun, spark-vllm-docker), "
              "listing what it could not carry; nothing it writes is valid until pinned",
    "pin": "resolve the recipe's image tag to its digest and its branches to their commits, show the change "
           "and write it on confirmation; --check says what has moved, touching nothing",
}


def add_parser(verbs: Any) -> None:
    """The `recipe` verb and its actions, on the command's subparsers."""
    text = "import the field's recipes, pin what they leave floating (touches no Spark)"
    recipe = verbs.add_parser("recipe", help=text, description=text)
    actions = recipe.add_subparsers(dest="action", required=True, metavar="ACTION")
    imports = actions.add_parser("import", help=ACTIONS["import"], description=ACTIONS["import"])
    imports.add_argument("sources", nargs="+", metavar="FILE|DIR", help="recipe files, or folders of them")
    imports.add_argument("--out", metavar="DIR", help="where to write the recipes (default: the project's recipes/)")
    imports.add_argument("--dry-run", action="store_true", help="say what would be written, write nothing")
    pin = actions.add_parser("pin", help=ACTIONS["pin"], description=ACTIONS["pin"])
    pin.add_argument("recipe", metavar="NAME|FILE", help="a recipe of recipes/ by name, or a recipe file")
    pin.add_argument("--yes", action="store_true", help="write without asking (for scripts)")
    pin.add_argument("--check", action="store_true",
                     help="exit 1 when a tag or branch no longer points to what the recipe pins; write nothing")
    pin.add_argument("--credentials", metavar="FILE",
                     help="a variables file, plain or encrypted with Ansible Vault, holding "
                          "sparkserve_registry_credentials (per registry host: username, password) and "
                          "weights_hf_token; without it the hub token is HF_TOKEN's")
    pin.add_argument("--vault-password-file", metavar="FILE", help="the Vault password of --credentials")
    pin.add_argument("--registry", action="append", default=[], metavar="HOST=URL",
                     help="reach the registry HOST the recipe names at URL (repeatable), e.g. a mirror")
    pin.add_argument("--hub-endpoint", metavar="URL", help=f"the hub (default: HF_ENDPOINT, else {DEFAULT_HUB})")


def recipe_path(name: str, root: Path, cwd: Path) -> Path:
    """A recipe file by path, or by name in the project's recipes/."""
    candidate = Path(name).expanduser()
    for path in (candidate if candidate.is_absolute() else cwd / candidate, root / "recipes" / f"{name}.yml"):
        if path.is_file():
            return path
    raise UsageError(f"no recipe {name}: neither a file nor {root / 'recipes' / (name + '.yml')}")


def read_credentials(path: str | None, password_file: str | None, environ: Mapping[str, str],
                     ask_password: Callable[[str], str]) -> Credentials:
    if not path:
        return Credentials(hub_token=environ.get("HF_TOKEN", ""))
    try:
        data = Path(path).read_bytes()
    except OSError as error:
        raise UsageError(f"--credentials {path} cannot be read ({error.strerror})") from None
    if data.lstrip().startswith(b"$ANSIBLE_VAULT"):
        from ansible.constants import DEFAULT_VAULT_ID_MATCH
        from ansible.parsing.vault import AnsibleVaultError, VaultLib, VaultSecret

        secret = Path(password_file).read_text().strip() if password_file else ask_password("Vault password: ")
        try:
            data = VaultLib([(DEFAULT_VAULT_ID_MATCH, VaultSecret(secret.encode()))]).decrypt(data)
        except AnsibleVaultError:
            raise UsageError(f"--credentials {path}: the Vault password does not open it") from None
    try:
        loaded = yaml.safe_load(data) or {}
    except yaml.YAMLError:
        raise UsageError(f"--credentials {path} is not YAML") from None
    if not isinstance(loaded, dict):
        raise UsageError(f"--credentials {path} is not a mapping of variables")
    try:
        return Credentials.from_vars(loaded)
    except PinError as error:
        raise UsageError(f"--credentials {path}: {error}") from None


def write_atomic(path: Path, text: str) -> None:
    with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=f".{path.name}.", delete=False,
                                     encoding="utf-8") as handle:
        handle.write(text)
    os.chmod(handle.name, path.stat().st_mode & 0o777)
    os.replace(handle.name, path)


def run_import(args: argparse.Namespace, root: Path, cwd: Path, out: IO[str], err: IO[str]) -> int:
    from sparkserve.recipe_import import RecipeImportError, import_recipes

    target = Path(args.out).expanduser() if args.out else root / "recipes"
    sources = [Path(s).expanduser() if Path(s).expanduser().is_absolute() else cwd / s for s in args.sources]
    try:
        results = import_recipes(sources, target if target.is_absolute() else cwd / target, dry_run=args.dry_run)
    except RecipeImportError as error:
        err.write(f"sparkserve recipe import: {error}\n")
        return EXIT_BAD_INPUT
    for result in results:
        verb = ("would write" if args.dry_run else "wrote") if result.changed else "unchanged"
        out.write(f"{result.source} ({result.fmt}): {verb} {result.path}\n")
        for line in result.not_carried:
            out.write(f"  not carried: {line}\n")
        out.write(f"  not valid until pinned: sparkserve recipe pin {result.name}\n")
    return EXIT_OK


def run_pin(args: argparse.Namespace, root: Path, cwd: Path, environ: Mapping[str, str], out: IO[str],
            ask: Callable[[str], str], ask_password: Callable[[str], str], tty: bool) -> int:
    path = recipe_path(args.recipe, root, cwd)
    urls: dict[str, str] = {}
    for entry in args.registry:
        host, equals, url = entry.partition("=")
        if not equals or not host or not url.startswith(("http://", "https://")):
            raise UsageError(f"--registry {entry} is not HOST=URL (e.g. registry.local:5000=http://127.0.0.1:15000)")
        urls[host] = url
    def here(name: str | None) -> str | None:
        return str(cwd / Path(name).expanduser()) if name else None

    resolver = Resolver(read_credentials(here(args.credentials), here(args.vault_password_file), environ,
                                         ask_password),
                        urls, args.hub_endpoint or environ.get("HF_ENDPOINT") or DEFAULT_HUB)
    text = path.read_text(encoding="utf-8")
    try:
        pins = plan(text, resolver)
    except PinError as error:
        raise PinError(f"{path}: {error}") from None
    moved = [pin for pin in pins if pin.moved or pin.add_track is not None]
    name = path.stem
    if args.check:
        for pin in pins:
            if pin.moved:
                out.write(f"{path}: {pin.field}: {pin.follows} now points to {pin.after}; the recipe has "
                          f"{pin.before} (sparkserve recipe pin {name} writes it)\n")
        if any(pin.moved for pin in pins):
            return EXIT_FAILED
        out.write(f"{path}: pinned, and nothing it follows has moved ("
                  + (", ".join(f"{pin.field} follows {pin.follows}" for pin in pins) or "nothing to follow") + ")\n")
        return EXIT_OK
    if not moved:
        out.write(f"{path}: already pinned to what "
                  + (", ".join(f"{pin.follows}" for pin in pins) or "it names") + " points to now\n")
        return EXIT_OK
    after = apply(text, moved)
    out.write(diff(str(path), text, after))
    if not args.yes:
        if not tty:
            raise UsageError("not a terminal: give --yes to write the change shown")
        if ask(f"Write the pins to {path}? [y/N] ").strip().lower() not in ("y", "yes"):
            out.write("nothing written\n")
            return EXIT_OK
    write_atomic(path, after)
    out.write(f"wrote {path}\n")
    return EXIT_OK


def execute(args: argparse.Namespace, root: Path, cwd: Path, environ: Mapping[str, str], out: IO[str],
            err: IO[str], ask: Callable[[str], str], ask_password: Callable[[str], str], tty: bool) -> int:
    """Run `sparkserve recipe ACTION`; the exit code."""
    if args.action == "import":
        return run_import(args, root, cwd, out, err)
    try:
        return run_pin(args, root, cwd, environ, out, ask, ask_password, tty)
    except PinError as error:
        err.write(f"sparkserve recipe pin: {error}\n")
        return EXIT_FAILED
