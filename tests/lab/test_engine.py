"""Tests for the vLLM lab double (lab/engine): its command line, weight loading, text and metrics.

The multi-process tests (rendezvous, HTTP API, timings) are in test_engine_cluster.py.
"""

from __future__ import annotations

import json
import os
import re
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

import make_tiny_model
from sglang import launch_server
from vllm_double import VERSION, app, cli, generation, server, weights
from vllm_double.knobs import KnobError, Knobs, read_knobs
from vllm_double.logs import Logger
from vllm_double.metrics import Metrics
from vllm_double.openai_api import ApiError, parse_request
from vllm_double.state import EngineState

ENGINE = Path(__file__).resolve().parents[2] / "lab/engine"
ROOT = ENGINE.parents[1]

VLLM = ENGINE / "bin/vllm"
MIB = 1024 * 1024

RECIPE_FLAGS = [
    "/models/tiny", "--served-model-name", "tiny", "--tensor-parallel-size", "4", "--pipeline-parallel-size", "1",
    "--nnodes", "4", "--node-rank", "0", "--master-addr", "10.77.1.11", "--master-port", "29501",
    "--host", "127.0.0.1", "--port", "30198", "--kv-cache-dtype", "fp8", "--block-size", "2304",
    "--kv-cache-memory-bytes", "8589934592", "--max-model-len", "262144", "--gpu-memory-utilization", "0.75",
    "--max-num-seqs", "4", "--enable-prefix-caching", "--enable-chunked-prefill",
    "--speculative-config", '{"method":"dflash","model":"/models/draft","num_speculative_tokens":7}',
    "--load-format", "safetensors", "--trust-remote-code", "--generation-config", "auto", "--api-key", "k",
    "--enable-log-requests", "--max-num-batched-tokens", "8192", "--enforce-eager", "--dtype", "bfloat16",
    "--quantization", "modelopt_fp4", "--seed", "7",
]


def run_vllm(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(VLLM), *args], capture_output=True, text=True, timeout=30,
                          env={**os.environ, **(env or {})})


# --- command line ----------------------------------------------------------


def test_launcher_is_an_executable_python3_program() -> None:
    assert VLLM.read_text(encoding="utf-8").startswith("#!/usr/bin/python3\n")
    assert os.access(VLLM, os.X_OK)


def test_version() -> None:
    result = run_vllm("--version")
    assert result.returncode == 0
    assert result.stdout.strip() == VERSION


def test_every_recipe_flag_is_accepted() -> None:
    args = cli.parse_args(["serve", *RECIPE_FLAGS])
    assert cli.check_args(args) == []
    assert args.served_names == ("tiny",) and args.nnodes == 4 and args.master_addr == "10.77.1.11"
    assert args.kv_cache_memory_bytes == 8 * 1024**3 and args.max_model_len == 262144 and args.block_size == 2304
    assert args.enable_prefix_caching is True and args.enforce_eager is True and args.disable_log_requests is False
    assert args.num_speculative_tokens == 7 and args.speculative_config["model"] == "/models/draft"
    assert args.seed == 7 and args.dtype == "bfloat16" and args.quantization == "modelopt_fp4"
    flags = {name for flag in cli.FLAGS for name in flag.names if name.startswith("--")}
    assert flags <= set(RECIPE_FLAGS) | {"--headless"}


def test_vllm_spellings_underscores_equals_no_forms_short_names_human_sizes() -> None:
    args = cli.parse_args(["serve", "/m", "--tensor_parallel_size=2", "-pp", "1", "--max-model-len", "32k",
                           "--no-enable-prefix-caching", "--kv-cache-memory-bytes=8G", "-n", "2", "-r", "1",
                           "--headless"])
    assert args.tensor_parallel_size == 2 and args.max_model_len == 32000
    assert args.enable_prefix_caching is False and args.kv_cache_memory_bytes == 8 * 1024**3
    assert (args.nnodes, args.node_rank, args.headless, args.head) == (2, 1, True, False)
    assert args.served_names == ("/m",) and args.seed == 0 and args.max_num_seqs == 256


@pytest.mark.parametrize("words, message", [
    (["--bogus-flag", "1"], "unrecognized arguments: --bogus-flag"),
    (["--served-model"], "unrecognized arguments: --served-model"),  # no prefix expansion
    (["--speculative-config", "{nope"], "argument --speculative-config: invalid JSON"),
    (["--max-model-len", "1.5K"], "argument --max-model-len: invalid integer"),
    (["--dtype", "int3"], "argument --dtype: invalid choice"),
])
def test_bad_flags_exit_2_like_argparse(words: list[str], message: str) -> None:
    result = run_vllm("serve", "/models/tiny", *words)
    assert result.returncode == 2
    assert message in result.stderr
    assert result.stderr.startswith("usage: vllm")


@pytest.mark.parametrize("words, problem", [
    (["--nnodes", "2", "--node-rank", "2", "--headless"], "--node-rank is 2"),
    (["--nnodes", "2", "--node-rank", "1"], "needs --headless"),
    (["--headless"], "--headless on --node-rank 0"),
    (["--nnodes", "3", "-tp", "2"], "not a multiple of --nnodes 3"),
    (["--speculative-config", '{"method":"ngram"}'], "num_speculative_tokens"),
])
def test_inconsistent_flags_are_reported(words: list[str], problem: str) -> None:
    problems = cli.check_args(cli.parse_args(["serve", "/m", *words]))
    assert any(problem in p for p in problems), problems


def test_inconsistent_flags_exit_1_with_a_log_line(tmp_path: Path) -> None:
    result = run_vllm("serve", str(tmp_path), "--nnodes", "2", "--node-rank", "1")
    assert result.returncode == 1
    assert "ERROR" in result.stdout and "[rank 1]" in result.stdout and "needs --headless" in result.stdout


def test_the_lab_recipes_render_command_lines_the_double_accepts() -> None:
    from ansible_collections.sparkserve.deploy.plugins.module_utils.recipe.render import render_rank
    from ansible_collections.sparkserve.deploy.plugins.module_utils.recipe.validate import validate_recipe

    variables = {"lab_engine_image": "registry:5000/sparkserve/engine@sha256:" + "0a" * 32,
                 "lab_model_revision": "1b" * 20, "lab_release_revision": "2c" * 20}
    engines = set()
    for path in sorted((ROOT / "recipes").glob("lab-*.yml")):
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        recipe, errors = validate_recipe(data, path.stem, variables=variables)
        assert errors == []
        engines.add(recipe["engine"])
        nodes = recipe["parallel"]["tensor"] * recipe["parallel"]["pipeline"]
        for rank in range(nodes):
            argv = render_rank(recipe, path.stem, rank, nodes, "10.77.1.11")["argv"]
            if recipe["engine"] == "sglang":
                assert argv[:3] == ["python3", "-m", "sglang.launch_server"]
                args, problems, _ = launch_server.parse_args(argv[3:])
                assert problems == [], (path.name, rank, argv)
            else:
                assert argv[:2] == ["vllm", "serve"]
                args = cli.parse_args(argv[1:])
                assert cli.check_args(args) == [], (path.name, rank, argv)
            assert args.node_rank == rank and args.nnodes == nodes
            # One node needs no rendezvous: the double's own default address stands.
            assert args.master_addr == ("10.77.1.11" if nodes > 1 else "127.0.0.1")
            assert args.served_name == recipe["model"]["served_name"]
    assert engines == {"vllm", "sglang"}


def test_readme_documents_every_flag_and_knob() -> None:
    readme = (ENGINE / "README.md").read_text(encoding="utf-8")
    for flag in cli.FLAGS:
        for name in flag.names:
            assert "`%s" % name in readme, name
    knobs_source = (ENGINE / "vllm_double/knobs.py").read_text(encoding="utf-8")
    for variable in set(re.findall(r'"(VLLM_[A-Z0-9_]+)"', knobs_source)):
        assert "`%s`" % variable in readme, variable


def test_knobs_from_the_environment() -> None:
    knobs = read_knobs({"VLLM_DOUBLE_ITL_MS": "20", "VLLM_DOUBLE_ACCEPT": "0.9, 0.5", "VLLM_API_KEY": "s"})
    assert knobs.itl_ms == 20 and knobs.accept == (0.9, 0.5) and knobs.api_key == "s"
    assert read_knobs({}) == Knobs()
    for env in ({"VLLM_DOUBLE_ITL_MS": "fast"}, {"VLLM_DOUBLE_ACCEPT": "1.5"}, {"VLLM_DOUBLE_JOIN_TIMEOUT_S": "0"}):
        with pytest.raises(KnobError, match=next(iter(env))):
            read_knobs(env)


class MakesTheFile(threading.Event):
    """A stop event that is never set; waiting on it makes the hold file (a test letting the load go)."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path
        self.waits = 0

    def wait(self, timeout: float | None = None) -> bool:
        self.waits += 1
        self.path.touch()
        return False


def test_a_held_load_goes_on_once_its_file_exists(tmp_path: Path) -> None:
    hold = tmp_path / "go"
    knobs = read_knobs({"VLLM_DOUBLE_LOAD_HOLD_FILE": str(hold)})
    assert knobs.load_hold_file == str(hold)
    stop = MakesTheFile(hold)
    log = Logger(0)
    summary = app.load_weights(cli.parse_args(["serve", "/m", "--load-format", "dummy"]), knobs, log, stop)
    assert summary == "no shards (dummy load format)" and stop.waits == 1, "held until the file was made, then on"


def test_a_held_load_ends_when_the_engine_stops(tmp_path: Path) -> None:
    knobs = read_knobs({"VLLM_DOUBLE_LOAD_HOLD_FILE": str(tmp_path / "never")})
    stop = threading.Event()
    stop.set()
    with pytest.raises(weights.LoadInterrupted):
        app.load_weights(cli.parse_args(["serve", "/m", "--load-format", "dummy"]), knobs, Logger(0), stop)


def test_the_stall_and_crash_files_are_paths_unset_by_default(tmp_path: Path) -> None:
    knobs = read_knobs({"VLLM_DOUBLE_STALL_FILE": str(tmp_path / "stall"),
                        "VLLM_DOUBLE_CRASH_FILE": str(tmp_path / "crash")})
    assert knobs.stall_file == str(tmp_path / "stall") and knobs.crash_file == str(tmp_path / "crash")
    assert Knobs().stall_file is None and Knobs().crash_file is None
    assert read_knobs({"VLLM_DOUBLE_STALL_FILE": "", "VLLM_DOUBLE_CRASH_FILE": ""}) == Knobs()


def test_a_stalled_request_sees_its_client_go_away() -> None:
    ours, theirs = socket.socketpair()
    with ours, theirs:
        assert not server.client_gone(ours), "connected and quiet: still there"
        theirs.sendall(b"x")
        assert not server.client_gone(ours), "more bytes (a pipelined request) are not a goodbye"
        assert ours.recv(1) == b"x"
        theirs.close()
        assert server.client_gone(ours), "closed at its end"
    assert server.client_gone(ours), "our own end closed"


def test_a_load_allocates_and_touches_the_memory_its_knob_asks() -> None:
    knobs = read_knobs({"VLLM_DOUBLE_LOAD_ALLOC_MIB": "2.5"})
    assert knobs.load_alloc_mib == 2.5 and Knobs().load_alloc_mib == 0
    lines: list[str] = []
    held = app.allocate_during_load(knobs.load_alloc_mib, lines.append, threading.Event(), chunk_mib=1)
    assert [len(chunk) for chunk in held] == [weights.MIB, weights.MIB, weights.MIB // 2], "in chunks, the rest last"
    assert all(chunk[i] == 1 for chunk in held for i in range(0, len(chunk), app.PAGE_BYTES)), "every page written"
    assert lines[0] == "allocating 2.5 MiB during the load (VLLM_DOUBLE_LOAD_ALLOC_MIB)"
    assert app.allocate_during_load(0, lines.append, threading.Event()) == [] and len(lines) == 2, "0 takes none"
    with pytest.raises(KnobError, match="VLLM_DOUBLE_LOAD_ALLOC_MIB"):
        read_knobs({"VLLM_DOUBLE_LOAD_ALLOC_MIB": "-1"})


def test_the_load_holds_its_memory_until_it_ends(capsys: pytest.CaptureFixture[str]) -> None:
    knobs = read_knobs({"VLLM_DOUBLE_LOAD_ALLOC_MIB": "1"})
    app.load_weights(cli.parse_args(["serve", "/m", "--load-format", "dummy"]), knobs, Logger(0), threading.Event())
    out = capsys.readouterr().out
    assert out.index("allocating 1 MiB during the load (VLLM_DOUBLE_LOAD_ALLOC_MIB)") < out.index(
        "load format dummy") < out.index("the load is over: 1 MiB allocated for it released")
    stop = threading.Event()
    stop.set()
    with pytest.raises(weights.LoadInterrupted):
        app.load_weights(cli.parse_args(["serve", "/m", "--load-format", "dummy"]), knobs, Logger(0), stop)


# --- weights ---------------------------------------------------------------


@pytest.fixture
def model(tmp_path: Path) -> Path:
    make_tiny_model.make_model(tmp_path / "m", shards=3, shard_mib=0.25)
    return tmp_path / "m"


def test_tiny_model_is_deterministic_and_valid(tmp_path: Path) -> None:
    first = make_tiny_model.make_model(tmp_path / "a", shards=2, shard_mib=1)
    make_tiny_model.make_model(tmp_path / "b", shards=2, shard_mib=1)
    names = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "b").iterdir())
    assert names == ["config.json", "generation_config.json", "model-00001-of-00002.safetensors",
                     "model-00002-of-00002.safetensors", "model.safetensors.index.json", "tokenizer.json",
                     "tokenizer_config.json"]
    for name in names:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    header = weights.read_header(first[0])
    assert header.data_size == 1 * MIB and len(header.tensors) == 4
    assert {t.dtype for t in header.tensors} == {"BF16"}
    assert header.metadata == {"format": "pt"} and (8 + header.header_len) % 8 == 0
    index = json.loads((tmp_path / "a/model.safetensors.index.json").read_text(encoding="utf-8"))
    assert index["metadata"]["total_size"] == 2 * MIB and len(index["weight_map"]) == 8
    assert (tmp_path / "a/model-00001-of-00002.safetensors").read_bytes() != first[1].read_bytes()


def test_tiny_model_command_line(tmp_path: Path) -> None:
    script = ENGINE / "make_tiny_model.py"
    result = subprocess.run([sys.executable, str(script), str(tmp_path / "m"), "--shards", "2", "--shard-mib", "1"],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["shards"] == 2
    assert len(list((tmp_path / "m").glob("*.safetensors"))) == 2


def test_load_model_reads_every_byte(model: Path) -> None:
    lines: list[str] = []
    report = weights.load_model(model, 0, lines.append)
    assert report.shards == 3
    assert report.bytes_read == sum(p.stat().st_size for p in model.glob("*.safetensors"))
    assert len(lines) == 3
    assert lines[0].startswith("Loading safetensors checkpoint shards:  33% Completed | 1/3 "
                               "[model-00001-of-00003.safetensors: 4 tensors")
    assert lines[2].startswith("Loading safetensors checkpoint shards: 100% Completed | 3/3 [")


def _rewrite_header(path: Path, edit: Any) -> None:
    data = path.read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + length])
    edit(header)
    raw = json.dumps(header).encode("utf-8")
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data[8 + length:])


def _shift_first_tensor(header: dict[str, Any]) -> None:
    name = sorted(k for k in header if k != "__metadata__")[0]
    begin, end = header[name]["data_offsets"]
    header[name]["data_offsets"] = [begin + 10**9, end + 10**9]


CORRUPTIONS = {
    "truncated": (lambda p: p.write_bytes(p.read_bytes()[:-100]), "truncated or corrupt"),
    "padded": (lambda p: p.write_bytes(p.read_bytes() + b"\0" * 64), "truncated or corrupt"),
    "huge header length": (lambda p: p.write_bytes(struct.pack("<Q", 2**40) + p.read_bytes()[8:]),
                           "corrupt header length"),
    "tiny file": (lambda p: p.write_bytes(b"\1\0\0"), "too short"),
    "header not JSON": (lambda p: p.write_bytes(p.read_bytes()[:8] + b"{not json" + p.read_bytes()[17:]),
                        "not valid JSON"),
    "offsets outside the file": (lambda p: _rewrite_header(p, _shift_first_tensor), "does not hold|starts at"),
    "unknown dtype": (lambda p: _rewrite_header(
        p, lambda h: h[sorted(k for k in h if k != "__metadata__")[0]].update(dtype="Q3")), "unknown dtype"),
}


@pytest.mark.parametrize("corruption", sorted(CORRUPTIONS))
def test_corrupt_shards_fail_clearly(model: Path, corruption: str) -> None:
    damage, message = CORRUPTIONS[corruption]
    shard = model / "model-00002-of-00003.safetensors"
    damage(shard)
    with pytest.raises(weights.WeightError, match=message) as info:
        weights.load_model(model, 0, lambda _: None)
    assert str(info.value).startswith(shard.name)


def test_a_shard_missing_from_the_index_fails_naming_it(model: Path) -> None:
    (model / "model-00002-of-00003.safetensors").unlink()
    with pytest.raises(weights.WeightError, match="missing shard model-00002-of-00003.safetensors"):
        weights.load_model(model, 0, lambda _: None)


def test_index_mapping_a_tensor_to_the_wrong_shard_fails(model: Path) -> None:
    path = model / "model.safetensors.index.json"
    index = json.loads(path.read_text(encoding="utf-8"))
    index["weight_map"]["model.layers.0.self_attn.q_proj.weight"] = "model-00003-of-00003.safetensors"
    path.write_text(json.dumps(index), encoding="utf-8")
    with pytest.raises(weights.WeightError, match="does not hold it"):
        weights.load_model(model, 0, lambda _: None)


def test_no_shards_at_all(tmp_path: Path) -> None:
    with pytest.raises(weights.WeightError, match="no \\*.safetensors"):
        weights.load_model(tmp_path, 0, lambda _: None)
    with pytest.raises(weights.WeightError, match="does not exist"):
        weights.load_model(tmp_path / "nope", 0, lambda _: None)


class FakeClock:
    """time.monotonic and time.sleep of one module: the clock moves only when the code sleeps."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds > 0
        self.sleeps.append(seconds)
        self.now += seconds


def test_reads_are_rate_limited(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    [shard] = make_tiny_model.make_model(tmp_path / "m", shards=1, shard_mib=4)
    header = weights.read_header(shard)
    size = shard.stat().st_size
    started = time.monotonic()
    assert weights.read_shard(header, 40.0) == size
    assert time.monotonic() - started >= size / (40.0 * MIB)  # 4 MiB at 40 MiB/s: not faster than 0.1 s

    clock = FakeClock()
    monkeypatch.setattr(weights, "time", clock)
    assert weights.read_shard(header, 40.0) == size
    # Paced all along (a sleep after each 1 MiB chunk read), and just to the rate: no slower.
    assert len(clock.sleeps) == -(-size // MIB) and clock.now - 1000.0 == pytest.approx(size / (40.0 * MIB))
    clock.sleeps.clear()
    assert weights.read_shard(header, 0) == size
    assert clock.sleeps == []  # no limit: no sleep at all


def test_a_request_steps_out_when_due_and_not_later(monkeypatch: pytest.MonkeyPatch) -> None:
    """The timed steps of test_timings_concurrency_api_key_and_sources, on a clock that moves only by sleeps."""
    knobs = Knobs(ttft_base_ms=150, ttft_per_1k_ms=100, itl_ms=20)
    log = Logger(0)
    metrics = Metrics("tiny", 0)
    api = server.Api(cli.parse_args(["serve", "/m"]), knobs, EngineState(1, log), metrics, log, 2048)
    req = parse_request({"prompt": "word " * 500, "max_tokens": 11, "ignore_eos": True}, False, ("tiny",), 2048, 0)
    tokens, finish, steps = api.plan(req)
    assert len(tokens) == 11 and finish == "length" and [s.tokens for s in steps] == [1] * 11
    clock = FakeClock()
    monkeypatch.setattr(server, "time", clock)
    out = [(clock.now - 1000.0, step) for step in api.run_steps(req, steps)]
    # TTFT = 150 ms + 100 ms per 1000 prompt tokens x 500 = 200 ms, then one step every 20 ms.
    assert [at for at, _ in out] == pytest.approx([0.200 + 0.020 * i for i in range(11)])
    assert [step for _, step in out] == steps and len(clock.sleeps) == 11
    assert "vllm:generation_tokens_total{model_name=\"tiny\",engine=\"0\"} 11.0" in metrics.render()


# --- generated text, schedule, metrics ---------------------------------------


def test_output_is_deterministic_and_ends_within_max_tokens() -> None:
    digest = generation.request_digest("The capital of France is", 0.0, 0)
    assert digest == generation.request_digest("The capital of France is", 0.0, 0)
    assert digest != generation.request_digest("The capital of France is", 0.7, 0)
    for max_tokens in (1, 5, 100):
        count, finish = generation.output_length(digest, max_tokens, ignore_eos=False)
        assert 1 <= count <= max_tokens
        assert finish == ("stop" if count == generation.natural_length(digest) else "length")
    assert generation.output_length(digest, 300, ignore_eos=True) == (300, "length")
    tokens = generation.make_tokens(digest, 12)
    assert tokens == generation.make_tokens(digest, 12) and len("".join(tokens).split()) == 12


def test_schedule_timing_and_speculative_steps() -> None:
    knobs = Knobs(ttft_base_ms=100, ttft_per_1k_ms=200, itl_ms=20, accept=(1.0, 1.0, 0.0))
    digest = generation.request_digest("x", 1.0, 0)
    plain = generation.schedule(5, 500, knobs, 0, digest)
    assert [s.tokens for s in plain] == [1, 1, 1, 1, 1]
    assert plain[0].at_s == pytest.approx(0.2) and plain[-1].at_s == pytest.approx(0.28)
    spec = generation.schedule(10, 500, knobs, 3, digest)
    assert [(s.tokens, s.drafted, s.accepted) for s in spec] == [(1, 0, 0), (3, 3, 2), (3, 3, 2), (3, 3, 2)]
    short = generation.schedule(3, 0, knobs, 3, digest)
    assert [s.tokens for s in short] == [1, 2]
    random_accept = generation.schedule(400, 0, Knobs(accept=(0.8, 0.6, 0.4)), 3, digest)
    assert sum(s.tokens for s in random_accept) == 400
    assert random_accept == generation.schedule(400, 0, Knobs(accept=(0.8, 0.6, 0.4)), 3, digest)
    assert {s.accepted for s in random_accept[1:-1]} == {0, 1, 2, 3}


def test_metrics_use_vllm_names_and_labels() -> None:
    metrics = Metrics("tiny", 2)
    metrics.prefilled(5)
    metrics.stepped(generation.Step(0.0, 1))
    metrics.stepped(generation.Step(0.0, 2, drafted=2, accepted=1))
    metrics.finished("length")
    text = metrics.render()
    base = 'model_name="tiny",engine="0"'
    for line in ("vllm:prompt_tokens_total{%s} 5.0" % base, "vllm:generation_tokens_total{%s} 3.0" % base,
                 "vllm:spec_decode_num_drafts_total{%s} 1.0" % base,
                 "vllm:spec_decode_num_draft_tokens_total{%s} 2.0" % base,
                 "vllm:spec_decode_num_accepted_tokens_total{%s} 1.0" % base,
                 'vllm:spec_decode_num_accepted_tokens_per_pos_total{%s,position="0"} 1.0' % base,
                 'vllm:spec_decode_num_accepted_tokens_per_pos_total{%s,position="1"} 0.0' % base,
                 'vllm:request_success_total{%s,finished_reason="length"} 1.0' % base,
                 "vllm:num_requests_running{%s} 0.0" % base,
                 "# TYPE vllm:spec_decode_num_drafts_total counter"):
        assert line in text.splitlines()
    assert "spec_decode" not in Metrics("tiny", 0).render()


def test_request_checks_answer_like_vllm() -> None:
    names = ("tiny",)
    req = parse_request({"prompt": "a b c", "max_tokens": 4, "ignore_eos": True}, False, names, 100, 0)
    assert (req.prompt_tokens, req.max_tokens, req.ignore_eos, req.model) == (3, 4, True, "tiny")
    chat = parse_request({"messages": [{"role": "user", "content": [{"type": "text", "text": "a b"}]},
                                       {"role": "user", "content": "c"}]}, True, names, 100, 0)
    assert chat.prompt_tokens == 3 and chat.max_tokens == 97
    assert parse_request({"prompt": [5, 6, 7]}, False, names, 100, 0).prompt_tokens == 3
    for body, status, text in (({"prompt": "a", "model": "other"}, 404, "does not exist"),
                               ({"prompt": "a " * 99, "max_tokens": 2}, 400, "maximum context length is 100"),
                               ({"prompt": "  "}, 400, "cannot be empty"),
                               ({"prompt": "a", "max_tokens": 0}, 400, "at least 1"),
                               ({"prompt": "a", "temperature": -1}, 400, "temperature")):
        with pytest.raises(ApiError, match=text) as info:
            parse_request(body, False, names, 100, 0)
        assert info.value.status == status
