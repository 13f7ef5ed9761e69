"""sparkserve status on one screen."""

from __future__ import annotations

import io
from typing import Any

from cli_streams import model_of
from rich.console import Console

from sparkserve.status import render_status, short_image, short_time


def text(data: dict[str, Any], width: int = 100) -> str:
    console = Console(record=True, width=width, file=io.StringIO())
    console.print(render_status(data))
    return console.export_text()


def rows(output: str) -> list[list[str]]:
    return [line.split() for line in output.splitlines()]


def status() -> dict[str, Any]:
    data = model_of("status").stats["sparkserve_status"]
    assert isinstance(data, dict)
    return data


def test_the_rank_table() -> None:
    found = rows(text(status()))
    assert ["rank", "node", "state", "started", "image", "fingerprint"] in found
    assert ["0", "spark-1", "running", "12-02", "09:58:01", "engine@sha256:141cd527", "ok"] in found
    assert ["1", "spark-2", "running", "12-02", "09:57:59", "engine@sha256:141cd527", "changed"] in found


def test_readiness_and_the_endpoint() -> None:
    output = text(status())
    assert "deployment lab-tp2 · recipe lab-tp2" in output
    assert "Endpoint: http://172.30.77.11:8000 serving tiny-model" in output
    assert "Readiness: health 200 · models: tiny-model" in output


def test_each_node_s_guard_flusher_fabric_and_weights() -> None:
    output = text(status())
    found = rows(output)
    spark1 = found.index(["spark-1", "active", "inactive", "gid", "3", "verified"])
    assert found[spark1 + 1:spark1 + 3] == [["rocep1s0f1", "ACTIVE"], ["roceP2p1s0f1", "ACTIVE"]]
    spark2 = found.index(["spark-2", "active", "inactive", "gid", "4", "NOT", "verified:", "1", "file", "corrupt"])
    assert found[spark2 + 1:spark2 + 4] == [["rocep1s0f1", "ACTIVE"], ["roceP2p1s0f1", "DOWN"],
                                            ["roceP2p1s0f1", "is", "DOWN"]]
    assert "Guard on spark-1, last events:" in output
    assert "  09:58:00 armed: floor 4 GiB, 3 samples" in output
    assert "Guard on spark-2" not in output


def test_it_fits_80_columns() -> None:
    output = text(status(), width=80)
    assert all(len(line) <= 80 for line in output.splitlines())
    assert ["0", "spark-1", "running", "12-02", "09:58:01", "engine@sha256:141cd527", "ok"] in rows(output)


def test_a_stopped_deployment() -> None:
    data = status()
    data["ranks"] = [dict(r, state="absent", started_at="", image="", fingerprint_matches=False) for r in data["ranks"]]
    data["readiness"] = {"health": -1, "models": []}
    output = text(data)
    assert ["0", "spark-1", "absent", "-", "-", "-"] in rows(output)
    assert "Readiness: health not answered · models: none served" in output


def test_whatever_is_missing_is_left_out() -> None:
    assert text({}).strip() == "The status run reported nothing."
    output = text({"ranks": [], "nodes": [{"node": "spark-1"}]})
    assert "No rank is running." in output
    assert ["spark-1", "unknown", "unknown", "-", "-"] in rows(output)
    assert text({"readiness": {"health": 503, "models": ["m"]}}).strip() == "Readiness: health 503 · models: m"


def test_short_forms() -> None:
    assert short_image("reg:5000/a/engine@sha256:141cd527a97a160d") == "engine@sha256:141cd527"
    assert short_image("nvcr.io/nvidia/vllm:25.11") == "vllm:25.11"
    assert short_image("") == "-"
    assert short_time("2026-12-02T09:58:01.123456789Z") == "12-02 09:58:01"
    assert short_time("") == "-"


def test_the_supervisor_s_state_restarts_and_events() -> None:
    data = dict(status(), supervisor={
        "unit": "active", "state": "watching", "restarts_total": 2, "restarts_last_hour": 1,
        "last_events": [{"time": "2026-12-02T09:59:00+00:00", "event": "heal_started",
                         "cause": "rank 1 on spark-2 is not running (exited with code 137)"},
                        {"time": "2026-12-02T09:59:21+00:00", "event": "healed"}]})
    output = text(data)
    assert "Supervisor: watching · 2 restarts, 1 in the last hour" in output
    assert "  12-02 09:59:00 heal_started: rank 1 on spark-2 is not running (exited with code 137)" in output
    assert "  12-02 09:59:21 healed" in output
    held = text(dict(status(), supervisor={"state": "needs reboot: spark-2 (MemAvailable 0.4 GiB, needs 1 GiB)"}), 200)
    assert "Supervisor: needs reboot: spark-2 (MemAvailable 0.4 GiB, needs 1 GiB) · 0 restarts, 0 in the last hour" \
        in held
    assert "Supervisor" not in text(status())
