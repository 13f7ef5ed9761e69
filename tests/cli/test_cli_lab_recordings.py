"""The command on runs recorded from the lab (tools/record-cli-fixture.py): a 2-node up that downloads,
fans out and loads, and an up whose launch failed at the readiness timeout."""

from __future__ import annotations

from pathlib import Path

from cli_streams import model_of

from sparkserve.summary import EXIT_LAUNCH, EXIT_OK, classify, endpoint_lines, failure_lines


def test_the_recorded_up_shows_every_stage_every_bar_and_ends_with_the_endpoint() -> None:
    model = model_of("lab_up")
    assert classify(model, 0) == EXIT_OK
    assert [s.name for s in model.stages] == [
        "Preflight the Sparks", "Peer ssh between the Sparks, and node protection", "The recipe's image on every Spark",
        "Fabric between the Sparks", "Weights on every Spark", "Overlays on the pinned image", "Launch the engine"]
    bars = {(p.host, p.kind, p.label): p for p in model.progress.values()}
    download = bars[("spark-1", "download", "sparkserve-lab/tiny-model")]
    fanout = bars[("spark-2", "fanout", "sparkserve-lab/tiny-model")]
    assert download.complete and download.done == download.total > 0 and download.unit == "bytes"
    assert fanout.complete and fanout.done == fanout.total == download.total
    assert len(fanout.samples) >= 2, "the fan-out was seen while it moved"
    loads = sorted(p.rank for p in model.progress.values() if p.kind == "load")
    assert loads == [0, 1] and all(p.done == p.total == 4 for p in model.progress.values() if p.kind == "load")
    text = "\n".join(endpoint_lines(model))
    assert "Serving at http://172.30.77.11:8000" in text and "tiny-model" in text
    assert "0 → spark-1" in text and "1 → spark-2" in text
    assert "curl -s http://172.30.77.11:8000/v1/completions" in text


def test_the_recorded_failed_up_names_the_stage_node_rank_and_shows_the_rank_s_log() -> None:
    model = model_of("lab_up_failed")
    assert classify(model, 2) == EXIT_LAUNCH
    lines = failure_lines(model, 2, EXIT_LAUNCH, Path("/srv/sparkserve/artifacts/runs/x"))
    text = "\n".join(lines)
    assert 'stage "launch", node spark-1, rank 0' in text
    assert "not ready after" in text and "readiness.timeout_s 20" in text
    assert "engine init waits for /root/.cache/vllm/never" in text, "the tail of rank 0's log"
    assert "/srv/sparkserve/artifacts/lab-tp2/failed-" in text
    assert model.stages[-1].name == "Launch the engine" and model.stages[-1].state == "failed"
