"""The names a mistyped one probably meant, for messages that list what exists."""

from __future__ import annotations

import difflib
from typing import Any, List, Sequence

DOCUMENTATION = r"""
name: close_matches
short_description: The names a mistyped name probably meant
version_added: "0.2.0"
description:
  - The names of O(choices) closest to the input (Python's difflib), best first; none when nothing is close.
  - For messages that list what exists, so that they can say "did you mean lab-tp2?" first.
options:
  _input:
    description: The name as given.
    type: str
    required: true
  choices:
    description: The names that exist.
    type: list
    elements: str
    required: true
  count:
    description: At most this many.
    type: int
    default: 2
"""

EXAMPLES = r"""
near: "{{ 'lab-tp3' | sparkserve.deploy.close_matches(['lab-tp2', 'lab-tp4', 'glm53-fp4local-mtp-tp2']) }}"
# ['lab-tp2', 'lab-tp4']
"""

RETURN = r"""
_value:
  description: The close names, best first.
  type: list
  elements: str
"""


def close_matches(name: Any, choices: Sequence[Any], count: int = 2) -> List[str]:
    return difflib.get_close_matches(str(name), [str(choice) for choice in choices], n=count, cutoff=0.75)


class FilterModule:
    """Close matches of a mistyped name."""

    def filters(self) -> dict[str, Any]:
        return {"close_matches": close_matches}
