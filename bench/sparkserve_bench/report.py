"""The PNG report and the terminal summary of a results file.

Panels, three to a row, each 600 x 450 px (so the image is 1800 px wide and
450 px per row): output tok/s against concurrency, one panel per suite and
context length (candidate solid, reference dashed); prefill or decode tok/s by
context for prefill and long-context cells; acceptance per draft position
(candidate beside reference) for up to three cells; and, for a comparison,
each matched cell's speed and TTFT ratio against the gates.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from .errors import BenchError
from .reference import RefCell, Reference, matches

if TYPE_CHECKING:
    from matplotlib.axes import Axes

COLUMNS = 3
PANEL_PX = (600, 450)
DPI = 100
Panel = Callable[["Axes"], None]


def image_size(panels: int) -> tuple[int, int]:
    """Width and height in pixels of a report of this many panels."""
    rows = max(1, math.ceil(panels / COLUMNS))
    return PANEL_PX[0] * COLUMNS, PANEL_PX[1] * rows


def _ref_for(cell: Mapping[str, Any], reference: Reference | None) -> RefCell | None:
    if reference is None:
        return None
    for ref in reference.cells:
        if matches(ref, cell):
            return ref
    return None


def _temperature(cell: Mapping[str, Any]) -> str:
    value = cell.get("temperature")
    return "default" if value in (None, "default") else "%g" % float(value)


def _throughput_panels(cells: Sequence[Mapping[str, Any]], reference: Reference | None) -> list[Panel]:
    groups: dict[tuple[str, int], list[Mapping[str, Any]]] = {}
    for cell in cells:
        if cell["speed_metric"] == "tok_s" and cell["metrics"].get("tok_s") is not None:
            groups.setdefault((cell["suite"], int(cell["context"])), []).append(cell)
    panels: list[Panel] = []
    for (suite, context), members in sorted(groups.items()):
        def draw(ax: "Axes", suite: str = suite, context: int = context,
                 members: list[Mapping[str, Any]] = members) -> None:
            lines: dict[str, list[Mapping[str, Any]]] = {}
            for cell in members:
                label = "t=%s" % _temperature(cell) + ("" if cell.get("prompts") in (None, "mixed", "literal")
                                                       else " " + str(cell["prompts"]))
                lines.setdefault(label, []).append(cell)
            twin = None
            highest = 0.0
            for index, (label, group) in enumerate(sorted(lines.items())):
                color = "C%d" % index
                group = sorted(group, key=lambda c: c["concurrency"])
                xs = [c["concurrency"] for c in group]
                ax.plot(xs, [c["metrics"]["tok_s"] for c in group], "o-", color=color, label="candidate " + label)
                refs = [(c["concurrency"], float(r.metrics["tok_s"])) for c in group
                        for r in [_ref_for(c, reference)] if r is not None and r.metrics.get("tok_s") is not None]
                if refs:
                    ax.plot([x for x, _ in refs], [y for _, y in refs], "s--", color=color, alpha=0.8,
                            label="reference " + label)
                per_request = [float(c["metrics"].get("per_request_tok_s") or 0.0) for c in group]
                if len(group) > 1 and all(c["metrics"].get("per_request_tok_s") is not None for c in group):
                    twin = twin or ax.twinx()
                    highest = max([highest] + per_request)
                    twin.plot(xs, per_request, "^:", color=color, alpha=0.6, label="per request " + label)
            if twin is not None:
                twin.set_ylabel("tok/s per request (dotted)")
                twin.set_ylim(0, 1.2 * highest or 1.0)
                twin.legend(fontsize=7, loc="lower right")
            ax.set_title("%s, context %d: output tok/s" % (suite, context), fontsize=10)
            ax.set_xlabel("concurrency")
            ax.set_ylabel("tok/s (aggregate)")
            concurrencies = sorted({c["concurrency"] for c in members})
            if len(concurrencies) > 1 and concurrencies[-1] / max(concurrencies[0], 1) >= 8:
                ax.set_xscale("log", base=2)
            ax.set_xticks(concurrencies)
            ax.set_xticklabels([str(c) for c in concurrencies])
            ax.set_ylim(bottom=0)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
        panels.append(draw)
    return panels


def _bar_panel(cells: Sequence[Mapping[str, Any]], reference: Reference | None, metric: str, title: str) -> Panel:
    def draw(ax: "Axes") -> None:
        labels = [c["cell"] for c in cells]
        xs = list(range(len(cells)))
        ax.bar([x - 0.2 for x in xs], [c["metrics"].get(metric) or 0.0 for c in cells], 0.4, label="candidate")
        refs = [(x, r.metrics[metric]) for x, c in enumerate(cells) for r in [_ref_for(c, reference)]
                if r is not None and r.metrics.get(metric) is not None]
        if refs:
            ax.bar([x + 0.2 for x, _ in refs], [v for _, v in refs], 0.4, label="reference", hatch="//", alpha=0.7)
        ax.set_xticks(xs)
        ax.set_xticklabels(labels, rotation=20, fontsize=8)
        ax.set_ylabel(metric)
        ax.set_title(title, fontsize=10)
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=7)
    return draw


def _acceptance_panel(cells: Sequence[Mapping[str, Any]], reference: Reference | None) -> Panel | None:
    chosen = sorted([c for c in cells if c["metrics"].get("acceptance_per_position")],
                    key=lambda c: (c["concurrency"], c["context"], c["id"]))[:3]
    if not chosen:
        return None

    def draw(ax: "Axes") -> None:
        width = 0.8 / (2 * len(chosen))
        for index, cell in enumerate(chosen):
            values = cell["metrics"]["acceptance_per_position"]
            positions = [p + 1 for p in range(len(values))]
            offset = (2 * index - len(chosen)) * width
            color = "C%d" % index
            ax.bar([p + offset for p in positions], values, width, color=color,
                   label="%s (accept %.2f)" % (cell["id"], cell["metrics"].get("accept_length") or 0))
            ref = _ref_for(cell, reference)
            if ref is not None and ref.metrics.get("acceptance_per_position"):
                ref_values = ref.metrics["acceptance_per_position"]
                ax.bar([p + 1 + offset + width for p in range(len(ref_values))], ref_values, width, color=color,
                       alpha=0.45, hatch="//", label="reference " + ref.label)
        longest = max(len(c["metrics"]["acceptance_per_position"]) for c in chosen)
        ax.set_xticks(range(1, longest + 1))
        ax.set_title("acceptance per draft position", fontsize=10)
        ax.set_xlabel("draft position")
        ax.set_ylabel("accepted / drafts")
        ax.set_ylim(0, 1.35)
        ax.set_yticks([0, 0.2, 0.4, 0.6, 0.8, 1.0])
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=6, ncol=2, loc="upper right")
    return draw


def _ratio_panel(comparison: Mapping[str, Any]) -> Panel:
    def draw(ax: "Axes") -> None:
        cells = comparison["cells"]
        ys = list(range(len(cells)))
        speed = [(y, c["ratios"][c["speed_metric"]]) for y, c in enumerate(cells) if c["speed_metric"] in c["ratios"]]
        ttft = [(y, c["ratios"]["ttft_s"]) for y, c in enumerate(cells) if "ttft_s" in c["ratios"]]
        ax.plot([v for _, v in speed], [y for y, _ in speed], "o", markersize=8, label="speed ratio")
        ax.plot([v for _, v in ttft], [y for y, _ in ttft], "D", markersize=6, alpha=0.8, label="TTFT ratio")
        gates = comparison["gates"]
        limits = [1.0]
        if gates.get("throughput_floor") is not None:
            limits.append(gates["throughput_floor"])
            ax.axvline(gates["throughput_floor"], color="red", linestyle="--",
                       label="throughput floor %.2f" % gates["throughput_floor"])
        if gates.get("ttft_ceiling") is not None:
            limits.append(gates["ttft_ceiling"])
            ax.axvline(gates["ttft_ceiling"], color="purple", linestyle=":",
                       label="TTFT ceiling %.2f" % gates["ttft_ceiling"])
        ax.axvline(1.0, color="grey", linewidth=0.8)
        values = [v for _, v in speed + ttft] + limits
        margin = max(0.02, 0.1 * (max(values) - min(values)))
        ax.set_xlim(min(values) - margin, max(values) + margin)
        ax.set_ylim(len(cells) - 0.5, -0.5)
        ax.set_yticks(ys)
        ax.set_yticklabels([c["id"] for c in cells], fontsize=7)
        ax.set_xlabel("candidate / reference")
        verdict = "QUALIFIED" if comparison["passed"] else "NOT QUALIFIED"
        ax.set_title("ratios to the reference: %s" % verdict, fontsize=10,
                     color="green" if comparison["passed"] else "red")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return draw


def panels_for(candidate: Mapping[str, Any], reference: Reference | None = None,
               comparison: Mapping[str, Any] | None = None) -> list[Panel]:
    cells = candidate["cells"]
    panels = _throughput_panels(cells, reference)
    prefill = [c for c in cells if c["speed_metric"] == "prefill_tok_s"]
    if prefill:
        panels.append(_bar_panel(prefill, reference, "prefill_tok_s", "prefill tok/s by cell"))
    decode = [c for c in cells if c["speed_metric"] == "decode_tok_s"]
    if decode:
        panels.append(_bar_panel(decode, reference, "decode_tok_s", "long-context decode tok/s by cell"))
    acceptance = _acceptance_panel(cells, reference)
    if acceptance is not None:
        panels.append(acceptance)
    if comparison is not None and comparison["cells"]:
        panels.append(_ratio_panel(comparison))
    return panels


def render(path: str, candidate: Mapping[str, Any], reference: Reference | None = None,
           comparison: Mapping[str, Any] | None = None) -> tuple[int, int]:
    """Write the PNG; its (width, height) in pixels."""
    import matplotlib

    matplotlib.use("Agg")  # files only, never a display
    import matplotlib.pyplot as plt

    panels = panels_for(candidate, reference, comparison)
    width, height = image_size(len(panels))
    rows = height // PANEL_PX[1]
    fig, axes = plt.subplots(rows, COLUMNS, figsize=(width / DPI, height / DPI), dpi=DPI, squeeze=False)
    flat = [ax for row in axes for ax in row]
    for ax, draw in zip(flat, panels, strict=False):  # the grid can have spare axes
        draw(ax)
    for ax in flat[len(panels):]:
        ax.axis("off")
    if not panels:
        flat[0].text(0.5, 0.5, "no measured cell to draw", ha="center", va="center")
    context = candidate.get("context") or {}
    fig.suptitle("sparkserve-bench: recipe %s, model %s, nodes %s, %s" % (context.get("recipe") or "no recipe",
                                                             context.get("model") or "?",
                                                             context.get("node_count") or "?",
                                                             context.get("time") or "?"), fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.3 / (height / DPI)))
    try:
        fig.savefig(path, dpi=DPI, format="png")
    except OSError as exc:
        raise BenchError("cannot write %s: %s" % (path, exc.strerror or exc)) from None
    finally:
        plt.close(fig)
    return width, height


def text_summary(results: Mapping[str, Any]) -> str:
    """One line per cell, for the terminal."""
    header = ("cell", "C", "ctx", "tok/s", "per-req", "TTFT p50 ms", "p99", "ITL p50 ms", "p99", "TPOT ms",
              "accept", "req", "err")
    rows = []
    for cell in results["cells"]:
        m, p = cell["metrics"], cell["percentiles"]

        def pct(name: str, key: str, p: Mapping[str, Any] = p) -> str:
            entry = p.get(name)
            return "%.1f" % entry[key] if entry else "-"
        speed = m.get(cell["speed_metric"])
        rows.append((cell["id"], str(cell["concurrency"]), str(cell["context"]),
                     "-" if speed is None else "%.1f" % speed + ("" if cell["speed_metric"] == "tok_s" else "*"),
                     "-" if m.get("per_request_tok_s") is None else "%.1f" % m["per_request_tok_s"],
                     pct("ttft_ms", "p50"), pct("ttft_ms", "p99"), pct("itl_ms", "p50"), pct("itl_ms", "p99"),
                     "-" if m.get("tpot_ms") is None else "%.1f" % m["tpot_ms"],
                     "-" if m.get("accept_length") is None else "%.2f" % m["accept_length"],
                     str(cell["requests"]), str(cell["errors"])))
    widths = [max(len(r[i]) for r in [header] + rows) for i in range(len(header))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() for row in [header] + rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    context = results.get("context") or {}
    lines.insert(0, "recipe %s, model %s (revision %s), image %s, %s nodes, %s" % (
        context.get("recipe"), context.get("model"), context.get("model_revision"), context.get("image_digest"),
        context.get("node_count"), context.get("time")))
    lines.append("* tok/s column shows prefill_tok_s (prefill cells) or decode_tok_s (long-context cells)")
    lines.append("prompts: " + str((results.get("method") or {}).get("prompt_uniqueness", "")))
    return "\n".join(lines)
