"""The inventory variables a recipe's ``*_from`` fields name."""

from __future__ import annotations

from typing import Any, List

import yaml

from ansible_collections.sparkserve.deploy.plugins.module_utils.recipe.validate import variables_named

DOCUMENTATION = r"""
name: recipe_variables
short_description: The inventory variables a recipe's *_from fields name
version_added: "0.1.0"
description:
  - From a recipe as loaded from its YAML file, the names of the inventory variables its C(*_from) fields
    name (C(image_from), C(model.revision_from), C(overlays_from), C(model.file_overrides[].sha256_from),
    ...), in file order, each once.
  - Pass exactly these variables to C(recipe_render) as O(sparkserve.deploy.recipe_render#module:variables);
    it reports each one that is not set, with where to find its value.
options:
  _input:
    description:
      - The recipe, as loaded from its YAML file, or the text of the file. Anything else, and a text that is not
        valid YAML, gives an empty list (C(recipe_render) reads the file and says what is wrong with it).
    type: raw
    required: true
"""

EXAMPLES = r"""
recipe_from_keys: "{{ lookup('ansible.builtin.file', 'recipes/lab-tp2.yml') | sparkserve.deploy.recipe_variables }}"
"""

RETURN = r"""
_value:
  description: Variable names.
  type: list
  elements: str
"""


def recipe_variables(recipe: Any) -> List[str]:
    """The variables the recipe's *_from fields name (the recipe loaded, or its file's text)."""
    if isinstance(recipe, str):
        try:
            recipe = yaml.safe_load(recipe)
        except yaml.YAMLError:
            return []
    return variables_named(recipe)


class FilterModule:
    """sparkserve recipe filters."""

    def filters(self) -> dict[str, Any]:
        return {"recipe_variables": recipe_variables}
