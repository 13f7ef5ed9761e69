"""The engine adapters, one module per engine, and the registry the recipe's schema and render read.

``ENGINES`` maps a recipe's ``engine`` value to its adapter; ``ENGINE_NAMES``
is the sorted list of those values (the schema's choices). ``register`` adds
an adapter (the test suite adds a toy one this way).
"""

from __future__ import annotations

from typing import Dict, List

from ansible_collections.sparkserve.deploy.plugins.module_utils.engines import sglang, vllm
from ansible_collections.sparkserve.deploy.plugins.module_utils.engines.base import Engine

ENGINES: Dict[str, Engine] = {}
# The same list object for the life of the process: the schema holds it as the engine's choices.
ENGINE_NAMES: List[str] = []


def register(engine: Engine) -> None:
    """Make ENGINE a choice of the recipe's ``engine`` field."""
    if not engine.name or not engine.host_ip_variable:
        raise ValueError("an engine adapter needs a name and a host_ip_variable")
    ENGINES[engine.name] = engine
    ENGINE_NAMES[:] = sorted(ENGINES)


def unregister(name: str) -> None:
    """Remove the adapter NAME (for tests)."""
    ENGINES.pop(name, None)
    ENGINE_NAMES[:] = sorted(ENGINES)


for _adapter in (vllm.ENGINE, sglang.ENGINE):
    register(_adapter)
