"""A recipe checked against the schema (schema.py), its variables and the cluster it runs on.

The public entry points. ``validate_recipe`` checks a loaded recipe and fills
the defaults, resolving each ``*_from`` field from the variables given
(``variables_named`` lists them); ``validate_for_cluster`` checks the result
against the cluster it is about to run on. Every problem is reported at once,
each naming the field, the bad value and the fix. The work is in two modules:
walk.py walks the schema and resolves the ``*_from`` fields, checks.py holds
the checks across fields, of the engine's flags, of the named files and of
the cluster; ``file_expectation_problems`` (checks.py) is public too.

Pure standard library: this file also runs on the nodes, which have no
pyyaml. Callers load the YAML themselves (load.py reads a recipe file where PyYAML is).
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Tuple

from ansible_collections.sparkserve.deploy.plugins.module_utils.recipe.checks import (
    cluster_checks,
    cross_checks,
    file_checks,
    file_expectation_problems,
)
from ansible_collections.sparkserve.deploy.plugins.module_utils.recipe.schema import RECIPE_SPEC
from ansible_collections.sparkserve.deploy.plugins.module_utils.recipe.walk import (
    Checker,
    message,
    resolve,
    variables_named,
)

__all__ = ["by_digest", "file_expectation_problems", "validate_for_cluster", "validate_recipe", "variables_named"]


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
        return {}, [message(name, "the recipe", data, "it must be a YAML mapping of the fields in recipes/README.md")]
    resolved: Dict[str, str] = {}
    if variables is not None:
        data, resolved = resolve(data, name, variables, errors)
    checker = Checker(name, resolved)
    recipe = checker.mapping(RECIPE_SPEC, data, "")
    errors.extend(checker.errors)
    if isinstance(recipe.get("image"), str):
        recipe["image"] = by_digest(recipe["image"])
    errors.extend(cross_checks(recipe, name, data))
    if recipes_dir is not None:
        errors.extend(file_checks(recipe, name, recipes_dir, resolved))
    return recipe, errors


def by_digest(image: str) -> str:
    """IMAGE as the nodes pull and run it: ``REPO@sha256:...``, without the tag a pinned recipe keeps beside the
    digest (``REPO:TAG@sha256:...``, for people and ``sparkserve recipe pin --check``). Docker's own clients
    look a tagged digest up by the tag, and would pull again an image the node holds by its digest."""
    name, at, digest = image.partition("@")
    if not at:
        return image
    head, slash, last = name.rpartition("/")
    return "%s%s%s@%s" % (head, slash, last.split(":", 1)[0], digest)


def validate_for_cluster(recipe: Dict[str, Any], name: str, world_size: int,
                         hf_token_present: bool) -> List[str]:
    """Check a validated recipe against the cluster it is about to run on."""
    return cluster_checks(recipe, name, world_size, hf_token_present)
