"""The parts without a server: suites, references, gates, statistics (/metrics reading: test_engines.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from benchdouble import ROOT
from sparkserve_bench.compare import compare, parse_gates, table
from sparkserve_bench.errors import BenchError
from sparkserve_bench.prompts import Calibration, PromptMaker
from sparkserve_bench.reference import from_published, load_reference
from sparkserve_bench.results import build_context
from sparkserve_bench.stats import percentile
from sparkserve_bench.suites import load_suites, parse_suites

EXAMPLES = ROOT / "bench/examples"


def test_every_recipe_bench_suite_and_the_examples_parse() -> None:
    files = sorted((ROOT / "recipes").glob("*.yml")) + sorted(EXAMPLES.glob("*.yml"))
    checked = 0
    for path in files:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        if isinstance(data, dict) and isinstance(data.get("bench"), dict) and data["bench"].get("suites"):
            assert load_suites(path), path
            checked += 1
        elif isinstance(data, dict) and data.get("suites"):
            assert load_suites(path), path
            checked += 1
    assert checked >= 2


def test_seed_000_grid_expands_to_named_cells() -> None:
    suites = {s.name: s for s in load_suites(EXAMPLES / "seed000-dflash2-tp4.yml")}
    peak = suites["coding-peak"].cells
    assert [c.id for c in peak] == ["coding-peak/c1"]
    assert (peak[0].temperature, peak[0].max_tokens, peak[0].runs, peak[0].thinking) == (0.0, 2000, 3, False)
    assert peak[0].prompt == "Write a Python script that implements the Sieve of Eratosthenes"
    grid = suites["sustained-decode"].cells
    assert len(grid) == 12 and grid[0].id == "sustained-decode/c1-ctx0-tdefault"
    assert {c.mode for c in grid} == {"sustained"} and all(c.ignore_eos and c.duration_s == 30 for c in grid)
    assert "sustained-decode/c4-ctx4096-t0" in {c.id for c in grid}
    assert [c.name for c in suites["prefill"].cells] == ["ctx4096", "ctx8192", "ctx65536", "ctx131072"]


def test_seed_003_cells_and_their_speed_metrics() -> None:
    [_, speed] = load_suites(EXAMPLES / "seed003-fp4local-mtp-tp2.yml")
    cells = {c.name: c for c in speed.cells}
    assert cells["prose-c4"].concurrency == 4 and cells["prose-c4"].family == "prose"
    assert cells["code-c1"].family == "code" and cells["prose-c1"].reasoning_effort == "low"
    assert cells["input-32k-cached"].cached and cells["input-128k"].context == 131072
    assert cells["input-8k"].speed_metric == "decode_tok_s" and cells["prose-c1"].speed_metric == "tok_s"
    assert speed.cells[0].repetitions == 3


def test_suite_problems_are_all_reported() -> None:
    with pytest.raises(BenchError) as info:
        parse_suites([{"name": "a", "kind": "bogus"}, {"name": "b", "kind": "sustained", "duration_s": 0,
                                                       "temperatures": []},
                      {"kind": "cells", "primary": [{"concurrency": 2, "colour": "red"}]},
                      {"name": "b", "kind": "smoke"}, "not a mapping"])
    text = str(info.value)
    for part in ("suite a: kind is 'bogus'", "suite b: duration_s is 0", "suite b: temperatures is an empty list",
                 "primary[1]: unknown key 'colour'", "primary[1]: cell is None", "suite 5: give a mapping",
                 "suite 3: name is None"):
        assert part in text, text


def _candidate(cells: list[dict[str, Any]], server: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"format": "sparkserve-bench/results/1", "context": {}, "server": server or {}, "cells": [
        {"id": "%s/%s" % (c["suite"], c["cell"]), "concurrency": 1, "context": 0, "temperature": "default",
         "speed_metric": "tok_s", "errors": 0, **c} for c in cells]}


def test_seed_003_geometric_mean_from_its_published_figures() -> None:
    """The seed's 1.23434x: its qualified figures measured against its original ones."""
    doc = yaml.safe_load((EXAMPLES / "seed003-fp4local-mtp-tp2.yml").read_text(encoding="utf-8"))
    original = from_published(doc["reference"], "seed 003", baseline="original")
    qualified = from_published(doc["reference"], "seed 003", baseline="qualified")
    candidate = _candidate([{"suite": "speed", "cell": ref.selector["cell"],
                             "speed_metric": "decode_tok_s" if "decode_tok_s" in ref.metrics else "tok_s",
                             "metrics": ref.metrics} for ref in qualified.cells],
                           server={"max_model_len": 262144, "kv_tokens": 808020})
    gates = parse_gates(doc["gates"], "seed 003")
    result = compare(candidate, original, gates)
    assert result["geometric_mean_speed_ratio"] == pytest.approx(1.23434, abs=5e-5)
    assert result["passed"] and len(result["geomean_cells"]) == 4
    slower = compare(_candidate([{**c, "metrics": {"tok_s": c["metrics"].get("tok_s", 1) * 0.97,
                                                   "decode_tok_s": c["metrics"].get("decode_tok_s", 1)}}
                                 for c in candidate["cells"]], server={"max_model_len": 131072}),
                     qualified, gates)
    verdicts = {g["name"]: g["status"] for g in slower["gate_results"]}
    assert verdicts == {"no_request_errors": "pass", "require_all_cells": "pass", "throughput_floor": "fail",
                        "ttft_ceiling": "skip", "geomean_floor": "fail", "min_context_tokens": "fail",
                        "min_kv_tokens": "fail"}
    assert "not checked: the reference gives no ttft_s" in table(slower)
    assert "NOT QUALIFIED" in table(slower) and "speed/prose-c1" in table(slower)


def test_published_reference_problems_and_matching(tmp_path: Path) -> None:
    with pytest.raises(BenchError) as info:
        from_published({"cells": [{"suite": "s", "tok_s": {"original": 1, "qualified": 2}, "speed": 3},
                                  {"cell": "x"}], "extra": 1}, "r")
    text = str(info.value)
    for part in ("r: unknown key 'extra'", "r: source is None", "tok_s has several values (original, qualified)",
                 "unknown key 'speed'", "cells[2]: suite is None", "cells[2] gives no figure"):
        assert part in text, text
    ref = from_published({"source": "x", "cells": [{"suite": "s", "tok_s": 10}]}, "r")
    both = _candidate([{"suite": "s", "cell": "a", "metrics": {"tok_s": 10}},
                       {"suite": "s", "cell": "b", "metrics": {"tok_s": 10}}])
    with pytest.raises(BenchError, match="matches s/a, s/b"):
        compare(both, ref, parse_gates({}, "t"))
    recipe = tmp_path / "r.yml"
    recipe.write_text(yaml.safe_dump({"bench": {"suites": [{"name": "smoke"}]}}), encoding="utf-8")
    with pytest.raises(BenchError, match="has no bench.reference"):
        load_reference(str(recipe), published=True)


def test_gates_and_context_are_checked() -> None:
    with pytest.raises(BenchError) as info:
        parse_gates({"throughput_floor": "98%", "geomean_cells": "speed/*", "summary": "mean", "x": 1}, "t")
    for part in ("throughput_floor is '98%'", "geomean_cells is 'speed/*'", "summary is 'mean'", "unknown gate 'x'"):
        assert part in str(info.value)
    context, warnings = build_context({"recipe": "r", "model_revision": "main", "node_count": 2},
                                      {"image_digest": "img:latest", "overlays": []})
    assert context["recipe"] == "r" and context["node_count"] == 2 and context["overlays"] is None
    assert any("not a full 40-character commit" in w for w in warnings)
    assert any("not sha256:" in w for w in warnings)
    _, missing = build_context(None, {"recipe": "faster", "overlays": []})
    assert missing == ["context has no model_revision, image_digest, node_count: the results will not say what "
                       "was measured"]
    with pytest.raises(BenchError, match="time is written by the run itself"):
        build_context({"time": "now"}, {})
    with pytest.raises(BenchError, match="unknown key 'reciep'"):
        build_context({"reciep": "r"}, {})


def test_prompts_are_unique_and_contexts_calibrated() -> None:
    maker = PromptMaker(1)
    nonces = {maker.nonce() for _ in range(1000)}
    assert len(nonces) == 1000 and PromptMaker(1).nonce() == PromptMaker(1).nonce()
    calibration = Calibration(tokens_per_word=1.25, overhead_tokens=12, source="usage")
    task = "Write a haiku."
    prompt = maker.build(task, calibration.filler_words(4096, len(task.split())))
    assert prompt.endswith(task) and prompt.startswith("[")
    assert 12 + 1.25 * (len(prompt.split()) - 1) == pytest.approx(4096, abs=2)
    assert calibration.filler_words(0, 3) == 0


def test_percentiles_interpolate() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == pytest.approx(50.5)
    assert percentile(values, 99) == pytest.approx(99.01)
    assert percentile([3.0], 90) == 3.0
