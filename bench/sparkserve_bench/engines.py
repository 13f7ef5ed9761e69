"""The engines the bench knows: the collection's adapters, each read only through its ``metric_names``.

The adapters live in the collection sparkserve.deploy
(``plugins/module_utils/engines/``, importable with the checkout's
``collections`` folder on ``PYTHONPATH``: ``tools/sparkserve-bench`` and the
bench role put it there). A new adapter is a new choice of ``--engine`` and a
new candidate of detection, with no change here.
"""

from __future__ import annotations

from .errors import BenchError
from .promparse import AmbiguousEngineError, EngineMetrics, Families, detect

try:
    from ansible_collections.sparkserve.deploy.plugins.module_utils import engines as _adapters
except ImportError as exc:  # pragma: no cover - a broken environment, said plainly
    raise ImportError("sparkserve_bench reads each engine's metric names from the collection sparkserve.deploy; "
                      "put the checkout's collections folder on PYTHONPATH (tools/sparkserve-bench does): %s"
                      % exc) from exc


def names() -> list[str]:
    """The registered engines, sorted (the choices of ``--engine``)."""
    return sorted(_adapters.ENGINES)


def metrics_of(engine: str) -> EngineMetrics:
    """What the engine ENGINE exposes, from its adapter."""
    adapter = _adapters.ENGINES.get(engine)
    if adapter is None:
        raise BenchError("engine %r has no adapter; the engines are: %s" % (engine, ", ".join(names())))
    return EngineMetrics(adapter.name, dict(adapter.metric_names))


def detect_engine(families: Families) -> EngineMetrics | None:
    """The registered engine whose metrics the reading holds, or None when it holds none of any."""
    try:
        return detect(families, [metrics_of(name) for name in names()])
    except AmbiguousEngineError as exc:
        raise BenchError("/metrics holds the metrics of several engines (%s); pass --engine with the deployment's "
                         "engine" % exc) from None
