"""tools/dashboard-png.py: the dashboard's panels drawn from canned query_range answers (no network)."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any, Dict, List

import pytest

from tests.scripts import load_script

png = load_script("tools/dashboard-png.py", "dashboard_png")

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def matrix(*series: Dict[str, Any]) -> Dict[str, Any]:
    return {"resultType": "matrix", "result": list(series)}


def ramp(metric: Dict[str, str], start: float = 1_700_000_000, points: int = 20, scale: float = 1.0) -> Dict[str, Any]:
    return {"metric": metric, "values": [[start + 15 * i, f"{scale * i:g}"] for i in range(points)]}


def png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == PNG_SIGNATURE and head[12:16] == b"IHDR"
    width, height = struct.unpack(">II", head[16:24])
    return width, height


def test_legend_fills_each_label() -> None:
    labels = {"__name__": "x", "node": "spark-1", "transport": "NET/IB"}
    assert png.legend("{{node}} {{ transport }}", labels) == "spark-1 NET/IB"
    assert png.legend("{{node}} {{missing}}", labels) == "spark-1"
    assert png.legend("", labels) == 'x{node="spark-1", transport="NET/IB"}'
    assert png.legend("__auto", {"deployment": "d"}) == '{deployment="d"}'


def test_unit_label() -> None:
    assert [png.unit_label(u) for u in ("suffix: tok/s", "Bps", "short", "percentunit", "ops")] == \
        ["tok/s", "bytes/s", "", "share, 0 to 1", "ops"]


def test_the_panels_are_chosen_by_title_with_their_queries_filled_in() -> None:
    board = png.queries.load_dashboard(png.queries.DASHBOARD)
    every = png.choose_panels(board, None, "lab-tp2")
    assert len(every) == len([p for p in png.queries.panels(board) if png.queries.panel_targets(p)])
    chosen = png.choose_panels(board, ["Fabric traffic per node", "Time to first token"], "lab-tp2")
    assert [panel.title for panel in chosen] == ["Fabric traffic per node", "Time to first token"]
    assert chosen[0].unit == "Bps" and [t.legend_format for t in chosen[1].targets] == ["p50", "p90", "p99"]
    for target in chosen[0].targets:
        assert "$" not in target.expr and 'deployment="lab-tp2"' in target.expr and "[1m]" in target.expr
        assert 'device=~"enp1s0f0np0|' in target.expr
    with pytest.raises(SystemExit, match="No such panel"):
        png.choose_panels(board, ["No such panel"], "lab-tp2")


def test_plot_writes_one_png_of_every_panel(tmp_path: Path) -> None:
    panels: List[Any] = [
        png.Panel("Tokens per second", "suffix: tok/s", [
            png.Target("a", "generated", matrix(ramp({"deployment": "lab-tp2"}, scale=10))),
            png.Target("b", "prompt", matrix(ramp({"deployment": "lab-tp2"}, scale=25)))]),
        png.Panel("Fabric traffic per node", "Bps", [
            png.Target("c", "{{node}} receive", matrix(ramp({"node": "spark-1"}, scale=1e8),
                                                       ramp({"node": "spark-2"}, scale=2e8))),
            png.Target("d", "{{node}} transmit", matrix({"metric": {"node": "spark-1"},
                                                         "values": [[1_700_000_000, "NaN"], [1_700_000_015, "+Inf"],
                                                                    [1_700_000_030, "3"]]}))]),
        png.Panel("Acceptance per draft position", "percentunit", [png.Target("e", "position {{position}}",
                                                                              matrix())]),
    ]
    out = tmp_path / "board" / "dashboard.png"
    png.plot(panels, out, title="lab-tp2, last 5 min")
    width, height = png_size(out)
    # Two columns, two rows (the last cell empty) at 100 dpi.
    assert (width, height) == (1400, 720)
    assert out.stat().st_size > 10_000


def test_fetch_asks_query_range_of_every_target(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: List[tuple[str, float, float, float]] = []

    def fake(prometheus: str, expr: str, start: float, end: float, step: float) -> Dict[str, Any]:
        asked.append((expr, start, end, step))
        return matrix(ramp({"node": "spark-1"}))

    monkeypatch.setattr(png, "query_range", fake)
    panels = [png.Panel("p", "", [png.Target("x", ""), png.Target("y", "")])]
    png.fetch(panels, "http://127.0.0.1:9090", 30, now=1_700_000_000)
    assert asked == [("x", 1_699_998_200, 1_700_000_000, 15), ("y", 1_699_998_200, 1_700_000_000, 15)]
    assert panels[0].targets[0].data["result"][0]["metric"] == {"node": "spark-1"}
    png.fetch(panels, "http://127.0.0.1:9090", 600, now=1_700_000_000)
    assert asked[-1][3] == 120


def test_the_arguments() -> None:
    args = png.parse_args(["--prometheus", "http://p:9090", "--deployment", "d", "--out", "x.png",
                           "--panels", "KV cache use", "Weights verified"])
    assert args.minutes == 30 and args.panels == ["KV cache use", "Weights verified"]
    with pytest.raises(SystemExit):
        png.parse_args(["--prometheus", "http://p:9090", "--deployment", "d", "--out", "x.png", "--minutes", "0"])
