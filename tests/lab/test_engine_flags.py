"""The lab's engine doubles take the flags of the engine versions whose flag lists sparkserve ships.

Recipes are checked against plugins/module_utils/engines/flags/ENGINE-VERSION.json
(made by tools/engine-flags.py from the real parsers); a double that took a
flag the real engine lacks would let the lab pass what a Spark refuses.
"""

from __future__ import annotations

import importlib
from types import ModuleType

import pytest

from ansible_collections.sparkserve.deploy.plugins.module_utils.engines import ENGINES, known_flags


def double_of(engine: str) -> ModuleType:
    return importlib.import_module({"vllm": "vllm_double.cli", "sglang": "sglang.launch_server"}[engine])


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_the_double_s_flags_are_the_real_engine_s_of_the_same_kind(engine: str) -> None:
    double = double_of(engine)
    version = double.VERSION if engine == "vllm" else importlib.import_module("sglang").__version__
    listed = known_flags.load(engine, version.split("+")[0])
    for flag in double.FLAGS:
        # store_true and BooleanOptionalAction ("bool") take no value, as the real switches.
        kind = known_flags.SWITCH if flag.kind in ("store_true", "bool") else known_flags.VALUE
        for name in flag.names:
            if name.startswith("--"):
                assert listed.flags.get(name[2:]) == kind, (engine, name)
                if flag.kind == "bool":
                    assert listed.flags.get("no-" + name[2:]) == known_flags.SWITCH, (engine, name)


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_every_engine_ships_a_flag_list_that_has_the_flags_sparkserve_sets(engine: str) -> None:
    shipped = known_flags.versions(engine)
    assert shipped, engine
    for version in shipped:
        listed = known_flags.load(engine, version)
        assert listed.engine == engine and listed.version == version and listed.parser and listed.made_from
        # tp and pp are vLLM's and SGLang's one-dash short forms (-tp, -pp), not long flags.
        missing = [flag for flag in ENGINES[engine].owned_flags if len(flag) > 2 and flag not in listed.flags]
        assert missing == [], (engine, version)
