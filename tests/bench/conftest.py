"""Fixtures of the bench tests: the lab double in configuration A (see benchdouble.py)."""

from __future__ import annotations

from typing import Iterator

import pytest

from benchdouble import KNOBS_A, SPEC_TOKENS, Double


@pytest.fixture(scope="session")
def double_a(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Double]:
    double = Double(tmp_path_factory.mktemp("double_a"), KNOBS_A, SPEC_TOKENS)
    yield double
    double.stop()
