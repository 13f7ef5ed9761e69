"""Fixtures of the bench tests: the lab doubles (see benchdouble.py) and a toy engine adapter.

sparkserve_bench reads engine metric names from the collection's adapters;
tests/conftest.py puts the checkout's collections folder on sys.path, and
benchdouble (through tools/bench-client.py) the bench's folder.
"""

from __future__ import annotations

from typing import Iterator

import pytest

from ansible_collections.sparkserve.deploy.plugins.module_utils import engines
from ansible_collections.sparkserve.deploy.plugins.module_utils.engines.base import Engine
from benchdouble import KNOBS_A, KNOBS_FAST, SPEC_TOKENS, Double, SGLangDouble

TOY = "toy"


class ToyEngine(Engine):
    """A third engine that exists only in these tests: its own metric names for every meaning the bench reads."""

    name = TOY
    host_ip_variable = "TOY_HOST_IP"
    metric_names = {
        "spec_drafts": "toy_verify_steps",
        "spec_draft_tokens": "toy_proposed_tokens",
        "spec_accepted_tokens": "toy_kept_tokens",
        "spec_accepted_per_position": "toy_kept_tokens_at",
        "spec_accept_length": "toy_mean_tokens_per_step",
        "cache_config_info": "toy_kv_pool_info",
    }


@pytest.fixture(scope="session")
def double_a(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Double]:
    double = Double(tmp_path_factory.mktemp("double_a"), KNOBS_A, SPEC_TOKENS)
    yield double
    double.stop()


@pytest.fixture(scope="session")
def sglang_double(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Double]:
    double = SGLangDouble(tmp_path_factory.mktemp("sglang_double"), KNOBS_FAST)
    yield double
    double.stop()


@pytest.fixture
def toy_engine() -> Iterator[Engine]:
    """The toy adapter, registered for one test."""
    adapter = ToyEngine()
    engines.register(adapter)
    try:
        yield adapter
    finally:
        engines.unregister(TOY)
