#!/usr/bin/env python3
"""The sparkserve dashboard's panels as one PNG, straight from Prometheus (no Grafana needed).

    tools/dashboard-png.py --prometheus http://127.0.0.1:9090 --dashboard grafana/sparkserve-dashboard.json \\
        --deployment lab-tp2 --minutes 30 --out dashboard.png [--panels TITLE ...]

For each chosen panel (every panel with queries by default), each target's expression is filled in as
tools/monitoring-queries.py fills it ($deployment, the dashboard's other variables at their defaults,
$__rate_interval and $__interval as 1m), asked of Prometheus's query_range API over the last MINUTES,
and drawn in one subplot per panel, titled as the panel, with a legend from the target's legendFormat.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import re
import sys
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from types import ModuleType
from typing import Any, Dict, List, Mapping, Optional, Sequence

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.dates import AutoDateLocator, ConciseDateFormatter
from matplotlib.figure import Figure

_LEGEND_LABEL = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")
# Points per series at most: the step is the range over this, and never below a scrape interval.
MAX_POINTS = 300
MIN_STEP_S = 15


def _load_queries() -> ModuleType:
    """tools/monitoring-queries.py (its name is no module name), for its variable substitution."""
    path = Path(__file__).resolve().with_name("monitoring-queries.py")
    spec = importlib.util.spec_from_file_location("monitoring_queries", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


queries = _load_queries()


@dataclass
class Target:
    expr: str
    legend_format: str
    # Prometheus's query_range answer (its "data" object): resultType matrix and the result.
    data: Dict[str, Any] = field(default_factory=dict)


@dataclass
class Panel:
    title: str
    unit: str
    targets: List[Target]


def legend(legend_format: str, labels: Mapping[str, str]) -> str:
    """LEGEND_FORMAT with each {{label}} filled from LABELS; without one, the series' labels as PromQL writes them."""
    if legend_format and legend_format != "__auto":
        return _LEGEND_LABEL.sub(lambda match: labels.get(match.group(1), ""), legend_format).strip()
    name = labels.get("__name__", "")
    rest = ", ".join(f'{key}="{value}"' for key, value in sorted(labels.items()) if key != "__name__")
    return f"{name}{{{rest}}}" if rest or not name else name


# Grafana's units, as the subplots' titles say them.
UNIT_LABELS = {"s": "seconds", "bytes": "bytes", "Bps": "bytes/s", "percentunit": "share, 0 to 1", "short": "",
               "none": ""}


def unit_label(unit: str) -> str:
    """A Grafana unit in words: "suffix: X" is X; an unknown unit is left as it is."""
    if unit.startswith("suffix:"):
        return unit[len("suffix:"):].strip()
    return UNIT_LABELS.get(unit, unit)


def choose_panels(dashboard: Mapping[str, Any], titles: Optional[Sequence[str]], deployment: str) -> List[Panel]:
    """The dashboard's panels named TITLES (all those with queries when None), their expressions filled in."""
    values = queries.dashboard_values(dashboard, deployment)
    found: Dict[str, Panel] = {}
    for panel in queries.panels(dashboard):
        targets = [Target(queries.substitute(str(target["expr"]), values), str(target.get("legendFormat") or ""))
                   for target in queries.panel_targets(panel) if not target.get("hide")]
        if targets:
            unit = str(((panel.get("fieldConfig") or {}).get("defaults") or {}).get("unit") or "")
            found.setdefault(str(panel.get("title", "")), Panel(str(panel.get("title", "")), unit, targets))
    if not titles:
        return list(found.values())
    unknown = [title for title in titles if title not in found]
    if unknown:
        raise SystemExit(f"no panel with queries is titled {unknown}; the dashboard's are: {sorted(found)}")
    return [found[title] for title in titles]


def query_range(prometheus: str, expr: str, start: float, end: float, step: float) -> Dict[str, Any]:
    """Prometheus's answer (its data object) to EXPR over [START, END] every STEP seconds."""
    url = prometheus.rstrip("/") + "/api/v1/query_range?" + urllib.parse.urlencode(
        {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"})
    with urllib.request.urlopen(url, timeout=30) as answer:
        body = json.load(answer)
    if body.get("status") != "success":
        raise RuntimeError(f"Prometheus answered {body.get('errorType')}: {body.get('error')} for {expr}")
    data: Dict[str, Any] = body["data"]
    return data


def fetch(panels: Sequence[Panel], prometheus: str, minutes: float, now: Optional[float] = None) -> None:
    """Fill each target's data with Prometheus's answer over the last MINUTES."""
    end = time.time() if now is None else now
    start = end - minutes * 60
    step = max(MIN_STEP_S, math.ceil(minutes * 60 / MAX_POINTS))
    for panel in panels:
        for target in panel.targets:
            target.data = query_range(prometheus, target.expr, start, end, step)


def _value(text: str) -> float:
    return float(text)  # Prometheus writes NaN, +Inf and -Inf as float() reads them


def plot(panels: Sequence[Panel], out: Path, title: str = "", columns: int = 2) -> None:
    """One subplot per panel, in a grid of COLUMNS, into the PNG OUT."""
    rows = max(1, math.ceil(len(panels) / columns))
    figure = Figure(figsize=(7 * columns, 3.6 * rows), layout="constrained")
    FigureCanvasAgg(figure)
    if title:
        figure.suptitle(title)
    axes_grid = figure.subplots(rows, columns, squeeze=False)
    for index, axes in enumerate(axes_grid.flat):
        if index >= len(panels):
            axes.set_visible(False)
            continue
        panel = panels[index]
        unit = unit_label(panel.unit)
        axes.set_title(panel.title + (f" ({unit})" if unit else ""), fontsize=10)
        axes.grid(True, alpha=0.3)
        lines = 0
        for target in panel.targets:
            for series in target.data.get("result") or []:
                points = series.get("values") or []
                if not points:
                    continue
                times = [datetime.fromtimestamp(float(t), tz=timezone.utc) for t, _ in points]
                axes.plot(times, [_value(v) for _, v in points], linewidth=1.2,
                          label=legend(target.legend_format, series.get("metric") or {}))
                lines += 1
        if lines:
            locator = AutoDateLocator()
            axes.xaxis.set_major_locator(locator)
            axes.xaxis.set_major_formatter(ConciseDateFormatter(locator))
            axes.legend(fontsize=7, loc="best")
        else:
            axes.text(0.5, 0.5, "no data", ha="center", va="center", transform=axes.transAxes, color="gray")
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, format="png", dpi=100)


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prometheus", required=True, help="Prometheus's URL, e.g. http://127.0.0.1:9090")
    parser.add_argument("--dashboard", type=Path, default=queries.DASHBOARD, help="the Grafana dashboard (JSON)")
    parser.add_argument("--deployment", required=True, help="the deployment to draw ($deployment)")
    parser.add_argument("--minutes", type=float, default=30, help="how far back to draw (default 30)")
    parser.add_argument("--out", type=Path, required=True, help="the PNG to write")
    parser.add_argument("--panels", nargs="+", metavar="TITLE", help="only these panels (their titles)")
    args = parser.parse_args(argv)
    if args.minutes <= 0:
        parser.error("--minutes must be more than 0")
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    panels = choose_panels(queries.load_dashboard(args.dashboard), args.panels, args.deployment)
    fetch(panels, args.prometheus, args.minutes)
    plot(panels, args.out, title=f"{args.deployment}, last {args.minutes:g} min")
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
