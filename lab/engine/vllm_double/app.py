"""``vllm serve``: start the head (rank 0, with the API) or a headless worker.

Exit codes: 0 after SIGTERM or SIGINT; 1 when the engine cannot start or a
worker loses its head; 2 for a command-line error (argparse).

``serve`` runs parsed arguments as one engine ``Flavor``: vLLM here, SGLang
for the ``sglang.launch_server`` shim beside this package.
"""

from __future__ import annotations

import json
import mmap
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from . import VERSION, cli
from .cli import ServeArgs
from .knobs import KnobError, Knobs, read_knobs
from .logs import Logger
from .metrics import Metrics
from .nccl import print_nccl_init
from .provenance import source_hashes
from .rendezvous import Channel, HeadRendezvous, JoinError, join_head, listen, start_heartbeat, watch_head
from .server import Api, DoubleHTTPServer
from .state import EngineState, Phase
from .weights import MIB, LoadInterrupted, WeightError, load_model

DEFAULT_MAX_MODEL_LEN = 2048
POLL_S = 0.1


@dataclass(frozen=True)
class Flavor:
    """Which engine the double answers as, where the engines differ."""

    engine: str = "vllm"  # owned_by of /v1/models; "sglang" adds its own routes
    title: str = "vLLM lab double"
    metrics_enabled: bool = True  # whether GET /metrics answers (404 otherwise)
    make_metrics: Callable[[str, int, int], Metrics] = Metrics  # (model name, draft tokens, KV capacity in tokens)


VLLM = Flavor()


def install_signals(stop: threading.Event, log: Logger) -> None:
    """SIGTERM and SIGINT ask the engine to stop; it exits 0."""
    def handler(signum: int, _frame: Any) -> None:
        if not stop.is_set():
            log.info("received %s; shutting down" % signal.Signals(signum).name)
        stop.set()
    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def read_config(model: Path) -> dict[str, Any]:
    """The model's config.json, which vLLM reads before anything else."""
    path = model / "config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise WeightError("no config.json in %s (is the model folder complete?)" % model) from None
    except (OSError, ValueError) as exc:
        raise WeightError("%s: cannot read (%s)" % (path, exc)) from None
    if not isinstance(config, dict):
        raise WeightError("%s is not a JSON object" % path)
    return config


def resolve_max_model_len(args: ServeArgs, config: dict[str, Any]) -> int:
    """--max-model-len, or the model's max_position_embeddings; raises WeightError if too long."""
    derived = config.get("max_position_embeddings")
    derived = derived if isinstance(derived, int) and derived > 0 else DEFAULT_MAX_MODEL_LEN
    if args.max_model_len is None or args.max_model_len == -1:
        return derived
    if args.max_model_len > derived:
        raise WeightError("User-specified max_model_len (%d) is greater than the derived max_model_len "
                          "(max_position_embeddings=%d in the model's config.json)" % (args.max_model_len, derived))
    return args.max_model_len


def _draft_folder(args: ServeArgs) -> Path | None:
    """The draft model's folder, when --speculative-config names one."""
    model = (args.speculative_config or {}).get("model")
    if not isinstance(model, str) or not model:
        return None
    path = Path(model)
    if path.is_dir():
        return path
    if path.is_absolute():
        raise WeightError("draft model folder %s (speculative-config model) does not exist" % model)
    return None


# How often a held load looks for its file (VLLM_DOUBLE_LOAD_HOLD_FILE).
HOLD_POLL_S = 0.2
# The load's memory (VLLM_DOUBLE_LOAD_ALLOC_MIB) is taken in pieces this large, so a container's memory cap
# kills the rank part way through, as it kills an engine that outgrows it.
ALLOC_CHUNK_MIB = 16.0
PAGE_BYTES = mmap.PAGESIZE


def allocate_during_load(mib: float, log: Callable[[str], None], stop: threading.Event,
                         chunk_mib: float = ALLOC_CHUNK_MIB) -> list[bytearray]:
    """Allocate `mib` MiB in chunks and write every page of them, so the rank's resident memory really grows;
    the caller keeps the chunks referenced until its load ends. Raises LoadInterrupted when asked to stop."""
    total = int(mib * MIB)
    if total <= 0:
        return []
    log("allocating %g MiB during the load (VLLM_DOUBLE_LOAD_ALLOC_MIB)" % mib)
    step = max(int(chunk_mib * MIB), PAGE_BYTES)
    held: list[bytearray] = []
    for start in range(0, total, step):
        if stop.is_set():
            raise LoadInterrupted()
        chunk = bytearray(min(step, total - start))
        # One byte written in every page: each page is the rank's own, resident, not the kernel's shared zero page.
        chunk[::PAGE_BYTES] = b"\x01" * len(range(0, len(chunk), PAGE_BYTES))
        held.append(chunk)
    log("holding %g MiB until the load ends" % (total / MIB))
    return held


def load_weights(args: ServeArgs, knobs: Knobs, log: Logger, stop: threading.Event) -> str:
    """Take the load's memory, read this rank's weights (and draft weights), then the init delay; a one-line
    summary. The memory is held until the load ends."""
    held = allocate_during_load(knobs.load_alloc_mib, log.info, stop)
    if args.load_format == "dummy":
        log.info("load format dummy: weights are not read")
        summary = "no shards (dummy load format)"
    else:
        report = load_model(Path(args.model), knobs.load_mib_s, log.info, stop)
        summary = "loaded %d shards, %.1f MiB in %.2f s" % (report.shards, report.bytes_read / MIB, report.seconds)
        log.info(summary)
        draft = _draft_folder(args)
        if draft is not None:
            extra = load_model(draft, knobs.load_mib_s, log.info, stop)
            log.info("draft model: loaded %d shards, %.1f MiB in %.2f s"
                     % (extra.shards, extra.bytes_read / MIB, extra.seconds))
    if knobs.load_delay_s > 0:
        log.info("engine init (VLLM_DOUBLE_LOAD_DELAY_S): %.1f s" % knobs.load_delay_s)
        if stop.wait(knobs.load_delay_s):
            raise LoadInterrupted()
    if knobs.load_hold_file:
        # A test holds the load here, in the middle, for as long as it needs, and lets it go by making the file.
        log.info("engine init waits for %s (VLLM_DOUBLE_LOAD_HOLD_FILE)" % knobs.load_hold_file)
        while not os.path.exists(knobs.load_hold_file):
            if stop.wait(HOLD_POLL_S):
                raise LoadInterrupted()
        log.info("%s is there: engine init goes on" % knobs.load_hold_file)
    if held:
        log.info("the load is over: %g MiB allocated for it released" % (sum(len(chunk) for chunk in held) / MIB))
    return summary


def run_in_thread(target: Callable[[], None], name: str) -> None:
    threading.Thread(target=target, daemon=True, name=name).start()


def log_start(args: ServeArgs, log: Logger, flavor: Flavor = VLLM) -> None:
    role = "head" if args.head else "headless worker"
    log.info("%s %s (sparkserve; not %s), %s, node rank %d of %d"
             % (flavor.title, VERSION, flavor.title.split()[0], role, args.node_rank, args.nnodes))
    log.info("model %s served as %s; tp=%d pp=%d; master %s:%d; speculative tokens %d"
             % (args.model, ",".join(args.served_names), args.tensor_parallel_size, args.pipeline_parallel_size,
                args.master_addr, args.master_port, args.num_speculative_tokens))
    for path, digest in source_hashes().items():
        log.info("source %s sha256=%s" % (path, digest))


# --- head ------------------------------------------------------------------


def _head_loader(args: ServeArgs, knobs: Knobs, log: Logger, state: EngineState,
                 stop: threading.Event) -> Callable[[], None]:
    def load() -> None:
        try:
            load_weights(args, knobs, log, stop)
        except LoadInterrupted:
            return
        except WeightError as exc:
            state.fail("weight loading failed: %s" % exc)
            return
        except Exception as exc:  # noqa: BLE001 (any fault must stop the head, not hang it)
            state.fail("weight loading failed: %r" % exc)
            return
        state.local_loaded()
    return load


def _open_head(args: ServeArgs, api: Api, log: Logger, stop: threading.Event,
               knobs: Knobs) -> DoubleHTTPServer | None:
    """Bind the API and the master port; None (after a log line) if either is busy."""
    try:
        server = DoubleHTTPServer(args.host, args.port, api)
    except OSError as exc:
        log.error("cannot listen on %s:%d for the API: %s" % (args.host or "0.0.0.0", args.port, exc.strerror or exc))
        return None
    if args.nnodes > 1:
        try:
            listener = listen(args.master_addr, args.master_port)
        except OSError as exc:
            log.error("cannot listen on the master port %d: %s" % (args.master_port, exc.strerror or exc))
            server.server_close()
            return None
        # NCCL's init lines (NCCL_DEBUG=INFO) once every worker rank has joined, before the engine can be ready.
        rendezvous = HeadRendezvous(api.state, log, knobs.heartbeat_s, knobs.heartbeat_timeout_s, stop,
                                    lambda: print_nccl_init(log, os.environ, args.node_rank, args.nnodes))
        rendezvous.start(listener)
        api.collective = rendezvous.step  # a request's first and last steps wait for every worker
        log.info("rendezvous: listening on port %d for %d worker ranks" % (args.master_port, args.nnodes - 1))
    return server


def _wait_head(state: EngineState, knobs: Knobs, log: Logger, stop: threading.Event, address: str) -> int:
    """Watch the engine until asked to stop (0) or a fatal fault (1)."""
    deadline = time.monotonic() + knobs.ready_timeout_s
    announced = False
    while not stop.is_set():
        if state.fatal_reason:
            log.error("engine failed: %s" % state.fatal_reason)
            return 1
        phase = state.phase
        if phase is not Phase.LOADING and not announced:
            log.info("Application startup complete; serving on %s" % address)
            announced = True
        if phase is Phase.LOADING and time.monotonic() > deadline:
            missing = state.missing_ranks()
            waiting = "node ranks %s" % missing if missing else "the head's own weights"
            log.error("engine not ready after %g s (VLLM_ENGINE_READY_TIMEOUT_S); still waiting for %s"
                      % (knobs.ready_timeout_s, waiting))
            return 1
        state.wait(POLL_S)
    return 0


def run_head(args: ServeArgs, knobs: Knobs, log: Logger, stop: threading.Event, max_model_len: int,
             flavor: Flavor = VLLM) -> int:
    state = EngineState(args.nnodes, log)
    # KV capacity: --max-num-seqs requests of up to max_model_len tokens each (see metrics.py).
    metrics = flavor.make_metrics(args.served_name, args.num_speculative_tokens, max_model_len * args.max_num_seqs)
    api = Api(args, knobs, state, metrics, log, max_model_len, flavor=flavor.engine,
              metrics_enabled=flavor.metrics_enabled)
    server = _open_head(args, api, log, stop, knobs)
    if server is None:
        return 1
    address = "http://%s:%d" % (args.host or "0.0.0.0", args.port)
    run_in_thread(lambda: server.serve_forever(poll_interval=POLL_S), "http")
    log.info("Starting %s API server 0 on %s (503 until the engine is ready)"
             % ("vLLM" if flavor.engine == "vllm" else flavor.engine, address))
    run_in_thread(_head_loader(args, knobs, log, state, stop), "loader")
    code = _wait_head(state, knobs, log, stop, address)
    server.shutdown()
    server.server_close()
    log.info("head stopped (exit %d)" % code)
    return code


# --- worker ----------------------------------------------------------------


def _worker_loader(args: ServeArgs, knobs: Knobs, log: Logger, channel: Channel, stop: threading.Event,
                   failure: list[str]) -> Callable[[], None]:
    def load() -> None:
        try:
            summary = load_weights(args, knobs, log, stop)
            channel.send({"type": "ready", "summary": summary})
        except LoadInterrupted:
            return
        except WeightError as exc:
            _report_failure(channel, failure, str(exc))
        except OSError as exc:
            failure.append("cannot report to the head: %s" % exc)
        except Exception as exc:  # noqa: BLE001 (any fault must stop the worker, not hang it)
            _report_failure(channel, failure, repr(exc))
    return load


def _report_failure(channel: Channel, failure: list[str], reason: str) -> None:
    failure.append("weight loading failed: %s" % reason)
    try:
        channel.send({"type": "failed", "reason": reason})
    except OSError:
        pass


def run_worker(args: ServeArgs, knobs: Knobs, log: Logger, stop: threading.Event) -> int:
    head = "%s:%d" % (args.master_addr, args.master_port)
    try:
        channel = join_head(args.master_addr, args.master_port, args.node_rank, args.nnodes,
                            knobs.join_timeout_s, knobs.heartbeat_timeout_s, log, stop)
    except JoinError as exc:
        if stop.is_set():
            return 0
        log.error(str(exc))
        return 1
    log.info("joined the head at %s as node rank %d of %d" % (head, args.node_rank, args.nnodes))
    print_nccl_init(log, os.environ, args.node_rank, args.nnodes)  # the distributed groups' init, before the load
    start_heartbeat(channel, knobs.heartbeat_s, stop)
    lost = threading.Event()
    lost_reason: list[str] = []
    failure: list[str] = []
    run_in_thread(lambda: watch_head(channel, lost, lost_reason), "head-watch")
    run_in_thread(_worker_loader(args, knobs, log, channel, stop, failure), "loader")
    while not stop.wait(POLL_S):
        if failure:
            log.error(failure[0])
            channel.close()
            return 1
        if lost.is_set():
            log.error("lost the head at %s (%s); exiting" % (head, lost_reason[0] if lost_reason else "?"))
            return 1
    channel.close()
    log.info("worker stopped (exit 0)")
    return 0


# --- entry -----------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """``vllm ...``; returns the exit code."""
    args = cli.parse_args(list(argv) if argv is not None else sys.argv[1:])
    return serve(args, cli.check_args(args))


def serve(args: ServeArgs, problems: list[str], flavor: Flavor = VLLM) -> int:
    """Run one rank from parsed arguments and the problems found in them; returns the exit code."""
    log = Logger(args.node_rank)
    problems = list(problems)
    try:
        knobs = read_knobs(os.environ)
    except KnobError as exc:
        problems.append(str(exc))
    for problem in problems:
        log.error(problem)
    if problems:
        return 1
    if knobs.crash_file and os.path.exists(knobs.crash_file):
        # A rank that crashes on every start while the file is there, with a line of vLLM's fatal patterns.
        log.error("RuntimeError: Engine core initialization failed (VLLM_DOUBLE_CRASH_FILE exists)")
        return 1
    stop = threading.Event()
    install_signals(stop, log)
    log_start(args, log, flavor)
    try:
        max_model_len = resolve_max_model_len(args, read_config(Path(args.model)))
    except WeightError as exc:
        log.error(str(exc))
        return 1
    if args.head:
        return run_head(args, knobs, log, stop, max_model_len, flavor)
    return run_worker(args, knobs, log, stop)
