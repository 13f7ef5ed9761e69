"""The gateway's metrics: Debian's mtail runs roles/gateway/files/gateway.mtail on the gateway's access log.

Each test writes a small access log in the gateway's format (nginx's log_format with escape=json, one JSON
object a line) and runs the real mtail binary on it: in one-shot mode (read the log, print the metrics, exit;
it listens all the same, so on loopback at a port of its choosing), and as the role's unit runs it (the
command line of templates/sparkserve-gateway-metrics.service.j2, scraped over HTTP). A machine without
mtail fails them: tools/setup-controller.sh installs it.
"""

from __future__ import annotations

import shlex
import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional, Tuple

import jinja2
import pytest

from tests.roles.exposition import SAMPLE, parse_labels

ROOT = Path(__file__).resolve().parents[1]
PROGRAM = ROOT / "roles" / "gateway" / "files" / "gateway.mtail"
UNIT = ROOT / "roles" / "gateway" / "templates" / "sparkserve-gateway-metrics.service.j2"
REQUESTS = "sparkserve_gateway_requests_total"
DURATION = "sparkserve_gateway_request_duration_seconds"
TTFB = "sparkserve_gateway_time_to_first_byte_seconds"
UNPARSED = "sparkserve_gateway_unparsed_lines_total"
DURATION_BOUNDS = ["0.05", "0.1", "0.25", "0.5", "1", "2.5", "5", "10", "20", "30", "60", "120", "300", "600", "+Inf"]
TTFB_BOUNDS = ["0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1", "2.5", "5", "10", "30", "60", "120", "300", "600",
               "+Inf"]

# mtail listens even when it only compiles or reads a log once: on loopback, at a free port, its log on stderr.
QUIET = ["--address", "127.0.0.1", "--port", "0", "--logtostderr"]

Sample = Tuple[str, Dict[str, str], float]


def mtail() -> str:
    path = shutil.which("mtail")
    if path is None:
        pytest.fail("mtail is missing: run tools/setup-controller.sh (it installs Debian's mtail package)")
    return path


def line(key: str, model: str, status: int, duration: str, ttfb: str, method: str = "POST",
         path: str = "/v1/chat/completions", sent: int = 1234) -> str:
    """One line as the gateway's nginx writes it."""
    return (f'{{"time":"2026-12-05T08:00:00+00:00","key":"{key}","model":"{model}","method":"{method}",'
            f'"path":"{path}","status":{status},"duration_s":{duration},"ttfb_s":"{ttfb}","bytes":{sent}}}')


# What the tests' gateway saw: alice and bob on two models, requests without a key or without a model, an
# engine that did not answer (502, 503: no upstream header time), one nginx asked twice (a list), a request
# answered under nginx's 1 ms (0.000) and one longer than the last bucket.
LOG = [
    line("alice", "lab-tp1", 200, "0.123", "0.045"),
    line("alice", "lab-tp1", 200, "12.500", "0.300"),
    line("bob", "lab-tp1", 502, "3.500", "-"),
    line("alice", "lab-tp2", 200, "42.000", "0.010, 0.020"),
    line("alice", "lab-tp2", 503, "0.000", "", sent=373),
    line("", "", 401, "0.000", "", method="GET", path="/v1/models", sent=300),
    line("", "", 401, "0.001", "", sent=300),
    line("carol", "", 200, "0.004", "", method="GET", path="/v1/models"),
    line("bob", "lab-tp2", 200, "700.000", "1.500 : 0.250"),
]


def one_shot(tmp_path: Path, lines: List[str]) -> List[Sample]:
    """The metrics mtail prints after reading LINES from the start, as (name, labels, value)."""
    progs = tmp_path / "progs"
    progs.mkdir()
    shutil.copy(PROGRAM, progs / PROGRAM.name)
    log = tmp_path / "access.log"
    log.write_text("".join(f"{text}\n" for text in lines), encoding="utf-8")
    done = subprocess.run([mtail(), "--one_shot", "--one_shot_format", "prometheus", "--emit_prog_label=false",
                           *QUIET, "--progs", str(progs), "--logs", str(log)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return samples(done.stdout)


def samples(text: str) -> List[Sample]:
    out: List[Sample] = []
    for row in text.splitlines():
        if not row or row.startswith("#"):
            continue
        match = SAMPLE.fullmatch(row)
        assert match is not None, f"bad sample line {row!r}"
        name, labels, value = match.groups()
        out.append((name, parse_labels(labels or ""), float(value)))
    return out


def series(found: List[Sample], name: str, *labels: str) -> Dict[Tuple[str, ...], float]:
    """NAME's values by the values of LABELS (every sample of NAME has exactly those labels)."""
    values: Dict[Tuple[str, ...], float] = {}
    for sample_name, sample_labels, value in found:
        if sample_name == name:
            assert sorted(sample_labels) == sorted(labels), (name, sample_labels)
            values[tuple(sample_labels[label] for label in labels)] = value
    return values


def buckets(found: List[Sample], name: str, **labels: str) -> Dict[str, float]:
    """The cumulative buckets of histogram NAME's series with LABELS, by le."""
    return {sample_labels["le"]: value for sample_name, sample_labels, value in found
            if sample_name == f"{name}_bucket" and {k: v for k, v in sample_labels.items() if k != "le"} == labels}


@pytest.fixture
def metrics(tmp_path: Path) -> List[Sample]:
    return one_shot(tmp_path, LOG)


def test_the_program_compiles(tmp_path: Path) -> None:
    progs = tmp_path / "progs"
    progs.mkdir()
    shutil.copy(PROGRAM, progs / PROGRAM.name)
    done = subprocess.run([mtail(), "--compile_only", *QUIET, "--progs", str(progs)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr


def test_each_request_counts_by_model_key_and_code_an_empty_one_as_none(metrics: List[Sample]) -> None:
    assert series(metrics, REQUESTS, "model", "key", "code") == {
        ("lab-tp1", "alice", "200"): 2,
        ("lab-tp1", "bob", "502"): 1,
        ("lab-tp2", "alice", "200"): 1,
        ("lab-tp2", "alice", "503"): 1,
        ("none", "none", "401"): 2,
        ("none", "carol", "200"): 1,
        ("lab-tp2", "bob", "200"): 1,
    }
    assert series(metrics, UNPARSED) == {(): 0}


def test_the_duration_of_each_request_by_model_and_key(metrics: List[Sample]) -> None:
    counts = series(metrics, f"{DURATION}_count", "model", "key")
    assert counts == {("lab-tp1", "alice"): 2, ("lab-tp1", "bob"): 1, ("lab-tp2", "alice"): 2, ("none", "none"): 2,
                      ("none", "carol"): 1, ("lab-tp2", "bob"): 1}
    sums = series(metrics, f"{DURATION}_sum", "model", "key")
    assert sums[("lab-tp1", "alice")] == pytest.approx(12.623)
    assert sums[("lab-tp2", "bob")] == pytest.approx(700)
    for model, key in counts:
        got = buckets(metrics, DURATION, model=model, key=key)
        assert list(got) == DURATION_BOUNDS, (model, key)
        assert got["+Inf"] == counts[(model, key)], (model, key)
    # 0.123 s and 12.5 s.
    alice = buckets(metrics, DURATION, model="lab-tp1", key="alice")
    assert (alice["0.1"], alice["0.25"], alice["10"], alice["20"]) == (0, 1, 1, 2)
    # 3.5 s: above 2.5, within 5.
    assert (buckets(metrics, DURATION, model="lab-tp1", key="bob")["2.5"],
            buckets(metrics, DURATION, model="lab-tp1", key="bob")["5"]) == (0, 1)
    # Requests answered under 1 ms (0.000) are in the first bucket, as every other one is in some bucket.
    assert buckets(metrics, DURATION, model="none", key="none")["0.05"] == 2
    assert buckets(metrics, DURATION, model="lab-tp2", key="alice")["0.05"] == 1
    # 700 s is only in +Inf.
    longest = buckets(metrics, DURATION, model="lab-tp2", key="bob")
    assert (longest["600"], longest["+Inf"]) == (0, 1)


def test_the_time_to_first_byte_by_model_only_when_an_engine_answered(metrics: List[Sample]) -> None:
    # "" (no engine asked) and "-" (an engine asked, none answered) are no number: nothing is observed, so the
    # requests without a model have no series at all.
    assert series(metrics, f"{TTFB}_count", "model") == {("lab-tp1",): 2, ("lab-tp2",): 2}
    sums = series(metrics, f"{TTFB}_sum", "model")
    # Of a list, the last: the engine that answered ("0.010, 0.020" and "1.500 : 0.250").
    assert sums[("lab-tp1",)] == pytest.approx(0.345)
    assert sums[("lab-tp2",)] == pytest.approx(0.270)
    tp2 = buckets(metrics, TTFB, model="lab-tp2")
    assert list(tp2) == TTFB_BOUNDS
    assert (tp2["0.01"], tp2["0.025"], tp2["0.1"], tp2["0.25"], tp2["+Inf"]) == (0, 1, 1, 2, 2)


def test_a_line_of_another_format_is_counted_as_unparsed_and_nothing_else(tmp_path: Path) -> None:
    found = one_shot(tmp_path, [
        '127.0.0.1 - - [05/Dec/2026:08:00:00 +0000] "GET / HTTP/1.1" 200 612',
        line("alice", "lab-tp1", 200, "0.123", "0.045").replace('"status":200', '"status":"200"'),
        line("alice", "lab-tp1", 200, "0.123", "0.045"),
    ])
    assert series(found, UNPARSED) == {(): 2}
    assert series(found, REQUESTS, "model", "key", "code") == {("lab-tp1", "alice", "200"): 1}


def test_prometheus_reads_the_exposition(tmp_path: Path) -> None:
    progs = tmp_path / "progs"
    progs.mkdir()
    shutil.copy(PROGRAM, progs / PROGRAM.name)
    (tmp_path / "access.log").write_text("".join(f"{text}\n" for text in LOG), encoding="utf-8")
    text = subprocess.run([mtail(), "--one_shot", "--one_shot_format", "prometheus", "--emit_prog_label=false",
                           *QUIET, "--progs", str(progs), "--logs", str(tmp_path / "access.log")],
                          capture_output=True, text=True, timeout=60, check=True).stdout
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: run tools/setup-controller.sh (it installs Debian's prometheus)"
    checked = subprocess.run([promtool, "check", "metrics"], input=text, text=True, capture_output=True,
                             timeout=60, check=False)
    assert checked.returncode == 0, checked.stdout + checked.stderr


# --- the unit's command line -----------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def exec_start(mtail_dir: Path, log_dir: Path, port: int) -> List[str]:
    """The unit's ExecStart, rendered as the role renders the template."""
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(UNIT.parent)), undefined=jinja2.StrictUndefined,
                             trim_blocks=True, keep_trailing_newline=True, autoescape=False)
    text = env.get_template(UNIT.name).render(ansible_managed="Ansible managed", __gateway_mtail_dir=str(mtail_dir),
                                              gateway_log_dir=str(log_dir), gateway_metrics_port=port,
                                              gateway_metrics_address="127.0.0.1")
    [command] = [row[len("ExecStart="):] for row in text.splitlines() if row.startswith("ExecStart=")]
    return shlex.split(command)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Tuple[int, Path]]:
    """mtail run with the unit's command line (its address loopback here), and the log it follows."""
    mtail_dir, log_dir = tmp_path / "mtail", tmp_path / "log"
    mtail_dir.mkdir()
    log_dir.mkdir()
    shutil.copy(PROGRAM, mtail_dir / PROGRAM.name)
    log = log_dir / "access.log"
    log.write_text(line("early", "lab-tp1", 200, "0.100", "0.050") + "\n", encoding="utf-8")
    port = free_port()
    argv = exec_start(mtail_dir, log_dir, port)
    assert argv[0] == "/usr/bin/mtail"
    assert argv[argv.index("--address") + 1] == "127.0.0.1", "the unit listens on gateway_metrics_address only"
    process = subprocess.Popen([mtail(), *argv[1:]], stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)
    try:
        assert scrape(port, lambda text: f"{UNPARSED} " in text) is not None, "mtail did not serve its metrics"
        yield port, log
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


def scrape(port: int, ready: Callable[[str], bool], wait_s: float = 15) -> Optional[str]:
    """/metrics once READY says so of it, or None after WAIT_S."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as answer:
                text = answer.read().decode()
            if ready(text):
                return text
        except OSError:
            pass
        time.sleep(0.2)
    return None


def test_the_unit_follows_the_log_from_its_end(served: Tuple[int, Path]) -> None:
    port, log = served
    with log.open("a", encoding="utf-8") as handle:
        handle.write(line("alice", "lab-tp1", 502, "1.000", "-") + "\n")
        handle.write(line("", "", 401, "0.000", "") + "\n")
    text = scrape(port, lambda text: 'code="401"' in text)
    assert text is not None, "mtail did not count the lines written after it started"
    found = samples(text)
    # The line that was there before it started is not counted (nor is the prog label there).
    assert series(found, REQUESTS, "model", "key", "code") == {("lab-tp1", "alice", "502"): 1,
                                                                ("none", "none", "401"): 1}
    assert series(found, f"{DURATION}_count", "model", "key") == {("lab-tp1", "alice"): 1, ("none", "none"): 1}
    assert series(found, f"{TTFB}_count", "model") == {}
