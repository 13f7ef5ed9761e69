"""The CLI end to end against the double: run, compare with gates, the PNG report, errors.

Configuration A (conftest) is measured once, through the CLI. The comparisons
use that results file and files derived from it, so their verdicts do not
depend on the machine's speed: an exact copy is the same configuration
(every ratio exactly 1, QUALIFIED); a copy with every speed doubled and every
time halved is a faster engine, against which the measured one fails the
gates (``compare`` exits 1). How closely two real runs agree is a benchmark's
question (tools/bench-client.py), not a test's.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from benchdouble import BENCH, COLLECTIONS, ROOT, Double, free_port

SPEED_SUITE = [{"name": "speed", "kind": "cells", "max_tokens": 60, "runs": 3,
                "primary": [{"cell": "prose-c1", "prompt": "prose", "concurrency": 1},
                            {"cell": "prose-c4", "prompt": "prose", "concurrency": 4}]}]
CONTEXT = {"recipe": "lab-glm53-fp4local-mtp", "model_revision": "1b" * 20,
           "image_digest": "sparkserve-lab-registry:5000/sparkserve/engine@sha256:" + "0a" * 32,
           "overlays": ["vllm_double-logs.patch"], "notes": "bench tests"}
SAME_GATES = '{"throughput_floor": 0.98, "ttft_ceiling": 1.05, "geomean_floor": 0.98}'
SPEEDUP = 2.0
RATE_METRICS = ("tok_s", "per_request_tok_s", "decode_tok_s", "prefill_tok_s")
TIME_METRICS = ("ttft_s", "itl_ms", "tpot_ms", "latency_s")


def bench(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``python -m sparkserve_bench``, on the PYTHONPATH the bench role gives it: the bench and the collections."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join((BENCH, COLLECTIONS))}
    return subprocess.run([sys.executable, "-m", "sparkserve_bench", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=str(ROOT))


def run_speed(double: Double, out: Path, *extra: str) -> dict[str, Any]:
    suites = out.parent / "suites.yml"
    suites.write_text(yaml.safe_dump(SPEED_SUITE), encoding="utf-8")
    result = bench("run", "--base-url", double.url, "--model", "tiny", "--suites", str(suites), "--out", str(out),
                   "--seed", "11", "--warmup-requests", "2", "--warmup-tokens", "16", "--quiet", *extra)
    assert result.returncode == 0, result.stderr
    return json.loads(out.read_text(encoding="utf-8"))


def faster(results: dict[str, Any], speedup: float, recipe: str) -> dict[str, Any]:
    """The same results as from an engine `speedup` times as fast: rates multiplied, times divided."""
    doc = copy.deepcopy(results)
    doc["context"]["recipe"] = recipe
    for cell in doc["cells"]:
        metrics = cell["metrics"]
        for key in RATE_METRICS:
            if metrics.get(key) is not None:
                metrics[key] *= speedup
        for key in TIME_METRICS:
            if metrics.get(key) is not None:
                metrics[key] /= speedup
    return doc


@pytest.fixture(scope="module")
def runs(double_a: Double, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """measured: one CLI run of configuration A (--engine as the bench role gives it); copy: the same bytes;
    faster: derived, SPEEDUP x as fast."""
    folder = tmp_path_factory.mktemp("runs")
    context = folder / "context.yml"
    context.write_text(yaml.safe_dump(CONTEXT), encoding="utf-8")
    paths = {name: folder / ("%s.json" % name) for name in ("measured", "copy", "faster")}
    measured = run_speed(double_a, paths["measured"], "--context", str(context), "--node-count", "1",
                         "--engine", "vllm")
    shutil.copyfile(paths["measured"], paths["copy"])
    paths["faster"].write_text(json.dumps(faster(measured, SPEEDUP, "faster"), indent=1), encoding="utf-8")
    return paths


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8"))


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def test_results_carry_the_context_and_every_cell(runs: dict[str, Path]) -> None:
    results = load(runs["measured"])
    context = results["context"]
    for key, value in CONTEXT.items():
        assert context[key] == value
    assert context["node_count"] == 1 and context["extra"] is None and context["model"] == "tiny"
    assert context["base_url"].startswith("http://127.0.0.1:") and context["time"] and context["finished"]
    assert context["warnings"] == []
    assert results["server"]["engine"] == "vllm" and results["server"]["engine_detected"] is False
    assert results["server"]["spec_decode_metrics"] is True
    assert results["format"] == "sparkserve-bench/results/1"
    assert results["method"]["seed"] == 11 and results["method"]["warmup"]["requests"] == 2
    assert [c["id"] for c in results["cells"]] == ["speed/prose-c1", "speed/prose-c4"]
    for cell, concurrency in zip(results["cells"], (1, 4), strict=True):
        assert cell["errors"] == 0 and cell["speed_metric"] == "tok_s" and cell["concurrency"] == concurrency
        assert cell["requests"] == 3 * concurrency and len(cell["samples"]) == 3  # runs: 3, each a burst
        assert cell["metrics"]["output_tokens"] == 60 and cell["tokens_source"] == "usage"
        assert {"p50", "p90", "p99"} <= set(cell["percentiles"]["ttft_ms"])
        assert {"p50", "p90", "p99"} <= set(cell["percentiles"]["itl_ms"])
        assert cell["spec_decode"]["drafts"] > 0 and 1 < cell["metrics"]["accept_length"] <= 4
    assert results["summary"]["requests"] == 15 and results["summary"]["errors"] == 0


def test_the_same_configuration_qualifies(runs: dict[str, Path], tmp_path: Path) -> None:
    assert runs["copy"].read_bytes() == runs["measured"].read_bytes()
    png, out = tmp_path / "report.png", tmp_path / "comparison.json"
    result = bench("compare", "--candidate", str(runs["copy"]), "--reference", str(runs["measured"]),
                   "--gates", SAME_GATES, "--report", str(png), "--out", str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "QUALIFIED" in result.stdout and "NOT QUALIFIED" not in result.stdout
    for gate in ("no_request_errors", "require_all_cells", "throughput_floor", "ttft_ceiling", "geomean_floor"):
        assert "PASS  %s" % gate in result.stdout, result.stdout
    assert "context differs" not in result.stdout
    comparison = load(out)
    assert comparison["passed"] and comparison["geometric_mean_speed_ratio"] == 1.0
    assert comparison["geomean_cells"] == ["speed/prose-c1", "speed/prose-c4"]
    for cell in comparison["cells"]:
        assert cell["ratios"] and set(cell["ratios"].values()) == {1.0}, cell["ratios"]
        assert cell["failures"] == [] and cell["errors"] == 0
    # Panels: tok/s against concurrency, acceptance per position, the ratios: one row of three.
    assert png_size(png) == (1800, 450)
    from PIL import Image
    with Image.open(png) as image:
        assert image.size == (1800, 450)
        assert len(image.convert("RGB").getcolors(maxcolors=1 << 16) or []) > 50  # drawn, not blank


def test_a_faster_reference_fails_the_gates(runs: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "comparison.json"
    result = bench("compare", "--candidate", str(runs["measured"]), "--reference", str(runs["faster"]),
                   "--out", str(out))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "NOT QUALIFIED" in result.stdout
    assert "FAIL  throughput_floor" in result.stdout and "FAIL  ttft_ceiling" in result.stdout
    assert "gates (default" in result.stdout
    assert "context differs: recipe: candidate 'lab-glm53-fp4local-mtp', reference 'faster'" in result.stdout
    comparison = load(out)
    assert not comparison["passed"]
    assert comparison["geometric_mean_speed_ratio"] == pytest.approx(1 / SPEEDUP)
    for cell in comparison["cells"]:
        assert cell["ratios"]["tok_s"] == pytest.approx(1 / SPEEDUP)
        assert cell["ratios"]["ttft_s"] == pytest.approx(SPEEDUP)
        assert len(cell["failures"]) == 2, cell["failures"]  # throughput and TTFT
    # The other way round, the faster engine qualifies against the measured one.
    reverse = bench("compare", "--candidate", str(runs["faster"]), "--reference", str(runs["measured"]))
    assert reverse.returncode == 0, reverse.stdout + reverse.stderr
    assert "PASS  throughput_floor" in reverse.stdout and "PASS  ttft_ceiling" in reverse.stdout


def _published(runs: dict[str, Path], folder: Path) -> Path:
    """A recipe whose bench.reference gives the faster figures as original and the measured ones as qualified."""
    measured = {c["cell"]: c["metrics"] for c in load(runs["measured"])["cells"]}
    fast = {c["cell"]: c["metrics"] for c in load(runs["faster"])["cells"]}
    cells = [{"suite": "speed", "cell": name,
              "tok_s": {"original": fast[name]["tok_s"], "qualified": measured[name]["tok_s"]},
              "acceptance_per_position": measured[name]["acceptance_per_position"]} for name in measured]
    recipe = {"name": "lab", "bench": {"suites": SPEED_SUITE,
                                       "reference": {"source": "these tests", "baseline": "qualified",
                                                     "cells": cells},
                                       "gates": {"throughput_floor": 0.98, "geomean_floor": 0.98,
                                                 "summary": "geometric_mean_speed_ratio"}}}
    path = folder / "recipe.yml"
    path.write_text(yaml.safe_dump(recipe), encoding="utf-8")
    return path


def test_published_figures_of_a_recipe_as_reference(runs: dict[str, Path], tmp_path: Path) -> None:
    recipe = _published(runs, tmp_path)
    passed = bench("compare", "--candidate", str(runs["copy"]), "--recipe-reference", str(recipe))
    assert passed.returncode == 0, passed.stdout + passed.stderr
    assert "bench.gates" in passed.stdout and "ttft_ceiling" not in passed.stdout
    assert "geometric mean of speed ratios: 1.0000 over 2 cells" in passed.stdout
    failed = bench("compare", "--candidate", str(runs["copy"]), "--recipe-reference", str(recipe),
                   "--baseline", "original", "--report", str(tmp_path / "r.png"))
    assert failed.returncode == 1 and "FAIL  throughput_floor" in failed.stdout
    assert "geometric mean of speed ratios: 0.5000 over 2 cells" in failed.stdout
    assert png_size(tmp_path / "r.png") == (1800, 450)


def test_report_prints_and_draws_a_results_file(runs: dict[str, Path], tmp_path: Path) -> None:
    result = bench("report", str(runs["measured"]), "--reference", str(runs["faster"]),
                   "--png", str(tmp_path / "x.png"))
    assert result.returncode == 0, result.stderr
    assert "speed/prose-c4" in result.stdout and "recipe lab-glm53-fp4local-mtp" in result.stdout
    assert png_size(tmp_path / "x.png") == (1800, 450)  # tok/s and acceptance: two panels, one row


def test_an_unreachable_server_is_a_clear_error(tmp_path: Path) -> None:
    suites = tmp_path / "s.yml"
    suites.write_text(yaml.safe_dump(SPEED_SUITE), encoding="utf-8")
    result = bench("run", "--base-url", "http://127.0.0.1:%d" % free_port(), "--model", "tiny",
                   "--suites", str(suites), "--out", str(tmp_path / "r.json"))
    assert result.returncode == 2
    assert "cannot reach the engine at http://127.0.0.1:" in result.stderr and "curl" in result.stderr
    assert not (tmp_path / "r.json").exists()


def test_a_model_not_served_is_a_clear_error(double_a: Double, tmp_path: Path) -> None:
    suites = tmp_path / "s.yml"
    suites.write_text(yaml.safe_dump(SPEED_SUITE), encoding="utf-8")
    result = bench("run", "--base-url", double_a.url + "/v1", "--model", "glm", "--suites", str(suites),
                   "--out", str(tmp_path / "r.json"))
    assert result.returncode == 2
    assert "model 'glm' is not served at %s; it serves: tiny" % double_a.url in result.stderr


def test_bad_inputs_list_every_problem(tmp_path: Path, runs: dict[str, Path]) -> None:
    suites = tmp_path / "s.yml"
    suites.write_text(yaml.safe_dump([{"name": "prefill", "duration_s": 3},
                                      {"name": "x", "concurrency": [1, 0], "kind": "sustained", "bogus": 1}]),
                      encoding="utf-8")
    result = bench("suites", str(suites))
    assert result.returncode == 2
    for text in ("suite prefill: unknown key 'duration_s' for kind prefill (it applies to kinds sustained)",
                 "suite prefill: give contexts", "suite x: unknown key 'bogus'", "suite x: concurrency is 0"):
        assert text in result.stderr, result.stderr
    gates = bench("compare", "--candidate", str(runs["measured"]), "--reference", str(runs["measured"]),
                  "--gates", '{"throughput": 0.98}')
    assert gates.returncode == 2 and "unknown gate 'throughput'" in gates.stderr
    wrong = bench("compare", "--candidate", str(suites), "--reference", str(runs["measured"]))
    assert wrong.returncode == 2 and "is not a sparkserve-bench results file" in wrong.stderr


def test_the_tools_wrapper_checks_a_suite_file() -> None:
    result = subprocess.run([str(ROOT / "tools/sparkserve-bench"), "suites",
                             str(ROOT / "bench/examples/seed000-dflash2-tp4.yml")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "sustained-decode/c4-ctx4096-t0: sustained, concurrency 4, context 4096" in result.stdout
