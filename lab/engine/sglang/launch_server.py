"""``python3 -m sglang.launch_server [flags]``: the lab double, as SGLang's server.

FLAGS is the one list of the SGLang flags the double accepts: the ones the
sparkserve recipes render for engine ``sglang`` and a few they may set through
``engine_args``, as SGLang 0.5.21 spells them (a test keeps them to its list,
plugins/module_utils/engines/flags/sglang-0.5.21.json). Any other flag is
refused as argparse refuses it ("unrecognized arguments", exit 2); prefixes
of long flags are refused too (stricter than SGLang, so that a recipe cannot
lean on an abbreviation).

The flags map onto the vLLM double's own behaviour: ``--dist-init-addr
HOST:PORT`` is the rendezvous (the head listens on PORT, the other ranks join
it), ``--node-rank`` 0 serves the OpenAI API on ``--host``/``--port`` and every
other rank runs without it, as SGLang's non-zero node ranks do. ``/health``,
``/health_generate``, ``/get_model_info`` and ``/v1/*`` answer as SGLang's;
``/metrics`` (``sglang:*`` series) only with ``--enable-metrics``.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from typing import Any, Sequence

from vllm_double.app import Flavor, serve
from vllm_double.cli import DTYPES, ServeArgs
from vllm_double.logs import Logger
from vllm_double.metrics import Metrics, _family

KV_CACHE_DTYPES = ("auto", "fp8_e5m2", "fp8_e4m3", "bf16", "bfloat16", "fp4_e2m1")


@dataclass(frozen=True)
class Flag:
    """One accepted flag: its names, how its value is read, its default."""

    names: tuple[str, ...]
    kind: str  # str, int, float, store_true, ints, addr
    default: Any
    help: str
    choices: tuple[str, ...] | None = None


def dist_init_addr(text: str) -> tuple[str, int]:
    """``HOST:PORT`` or ``[IPV6]:PORT``."""
    host, sep, port = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError("invalid address %r; give HOST:PORT (or [IPV6]:PORT)" % text)
    return host, int(port)


FLAGS: tuple[Flag, ...] = (
    Flag(("--model-path", "--model"), "str", None, "Folder of the model's weights (required)."),
    Flag(("--served-model-name",), "str", None, "Name clients use for the model (default: the model path)."),
    Flag(("--tp-size", "--tensor-parallel-size"), "int", 1, "Tensor-parallel size."),
    Flag(("--pp-size", "--pipeline-parallel-size"), "int", 1, "Pipeline-parallel size."),
    Flag(("--nnodes",), "int", 1, "Number of nodes in the rendezvous."),
    Flag(("--node-rank",), "int", 0, "This node's rank; 0 serves the API."),
    Flag(("--dist-init-addr",), "addr", None, "HOST:PORT of the head's rendezvous; needed with --nnodes > 1."),
    Flag(("--host",), "str", "127.0.0.1", "Address the API binds to."),
    Flag(("--port",), "int", 30000, "Port of the API."),
    Flag(("--kv-cache-dtype",), "str", "auto", "KV cache data type (recorded only).", KV_CACHE_DTYPES),
    Flag(("--page-size",), "int", None, "Tokens per KV page (recorded only)."),
    Flag(("--context-length",), "int", None, "Context length; default from config.json."),
    Flag(("--mem-fraction-static",), "float", None, "Fraction of memory for weights and KV (checked, recorded)."),
    Flag(("--max-running-requests",), "int", None, "Requests run at once; the rest wait (default 256 here)."),
    Flag(("--max-total-tokens",), "int", None, "KV pool size in tokens (recorded only)."),
    Flag(("--chunked-prefill-size",), "int", None, "Tokens per prefill chunk (recorded only)."),
    Flag(("--max-prefill-tokens",), "int", None, "Tokens per prefill batch (recorded only)."),
    Flag(("--disable-radix-cache",), "store_true", False, "No prefix cache (recorded only)."),
    Flag(("--enable-metrics",), "store_true", False, "Serve GET /metrics."),
    Flag(("--trust-remote-code",), "store_true", False, "Trust remote code (recorded only)."),
    Flag(("--load-format",), "str", "auto", "Weight format; 'dummy' skips reading the weights."),
    Flag(("--dtype",), "str", "auto", "Weight data type (recorded only).", DTYPES),
    Flag(("--quantization",), "str", None, "Quantization method (recorded only)."),
    Flag(("--random-seed",), "int", None, "Seed of the generated text and of speculative acceptance."),
    Flag(("--api-key",), "str", None, "Key required on /v1/* (also VLLM_API_KEY)."),
    Flag(("--log-requests",), "store_true", False, "Log each request."),
    Flag(("--speculative-algorithm",), "str", None, "Speculative decoding algorithm (EAGLE, NEXTN, ...)."),
    Flag(("--speculative-draft-model-path",), "str", None, "Folder of the draft model; loaded when it exists."),
    Flag(("--speculative-num-steps",), "int", None, "Draft steps: the draft tokens per step of the double."),
    Flag(("--speculative-eagle-topk",), "int", None, "Branching of the draft tree (recorded only)."),
    Flag(("--speculative-num-draft-tokens",), "int", None, "Tokens verified per step; without steps, k + 1."),
    Flag(("--cuda-graph-bs-decode",), "ints", None, "Batch sizes of the decode CUDA graphs (recorded only)."),
    Flag(("--disable-cuda-graph",), "store_true", False, "No CUDA graphs (recorded only)."),
    Flag(("--tool-call-parser",), "str", None, "Tool-call parser (recorded only)."),
    Flag(("--reasoning-parser",), "str", None, "Reasoning parser (recorded only)."),
    Flag(("--log-level",), "str", "info", "Log level (recorded only)."),
    Flag(("--watchdog-timeout",), "float", 300.0, "Seconds of a stuck batch before the server dies (recorded only)."),
)

_KIND_OPTIONS: dict[str, dict[str, Any]] = {
    "str": {"type": str},
    "int": {"type": int},
    "float": {"type": float},
    "store_true": {"action": "store_true"},
    "ints": {"type": int, "nargs": "+"},
    "addr": {"type": dist_init_addr},
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python3 -m sglang.launch_server", allow_abbrev=False,
                                     description="SGLang command line of the lab double (sparkserve); not SGLang.")
    for flag in FLAGS:
        options = dict(_KIND_OPTIONS[flag.kind], default=flag.default, help=flag.help)
        if flag.choices is not None:
            options["choices"] = flag.choices
        parser.add_argument(*flag.names, **options)
    return parser


def _draft_tokens(ns: argparse.Namespace) -> int | None:
    if ns.speculative_num_steps is not None:
        return int(ns.speculative_num_steps)
    if ns.speculative_num_draft_tokens is not None:
        return int(ns.speculative_num_draft_tokens) - 1
    return None


def check(ns: argparse.Namespace) -> list[str]:
    """Problems SGLang would find in its server arguments (it then exits 1)."""
    problems: list[str] = []
    if ns.model_path is None:
        problems.append("--model-path is required")
    for flag, value in (("--tp-size", ns.tp_size), ("--pp-size", ns.pp_size), ("--nnodes", ns.nnodes)):
        if value < 1:
            problems.append("%s is %d; it must be at least 1" % (flag, value))
    if not 0 <= ns.node_rank < max(ns.nnodes, 1):
        problems.append("--node-rank is %d; with --nnodes %d it must be from 0 to %d"
                        % (ns.node_rank, ns.nnodes, ns.nnodes - 1))
    world = ns.tp_size * ns.pp_size
    if ns.nnodes >= 1 and world % ns.nnodes:
        problems.append("--tp-size x --pp-size (%d) is not a multiple of --nnodes %d" % (world, ns.nnodes))
    if ns.nnodes > 1 and ns.dist_init_addr is None:
        problems.append("--dist-init-addr is needed with --nnodes %d: the ranks meet there" % ns.nnodes)
    if not 1 <= ns.port <= 65535:
        problems.append("--port must be from 1 to 65535")
    if ns.mem_fraction_static is not None and not 0 < ns.mem_fraction_static < 1:
        problems.append("--mem-fraction-static is %g; it must be between 0 and 1" % ns.mem_fraction_static)
    if ns.context_length is not None and ns.context_length < 1:
        problems.append("--context-length is %d; it must be at least 1" % ns.context_length)
    if ns.max_running_requests is not None and ns.max_running_requests < 1:
        problems.append("--max-running-requests is %d; it must be at least 1" % ns.max_running_requests)
    draft = _draft_tokens(ns)
    if ns.speculative_algorithm is not None and (draft is None or draft < 1):
        problems.append("--speculative-algorithm %s needs --speculative-num-steps (or --speculative-num-draft-tokens "
                        "of at least 2)" % ns.speculative_algorithm)
    return problems


def serve_args(ns: argparse.Namespace) -> ServeArgs:
    """The double's view of SGLang's arguments."""
    master_addr, master_port = ns.dist_init_addr or ("127.0.0.1", 29501)
    speculative = None
    if ns.speculative_algorithm is not None:
        speculative = {"method": ns.speculative_algorithm, "num_speculative_tokens": _draft_tokens(ns)}
        if ns.speculative_draft_model_path:
            speculative["model"] = ns.speculative_draft_model_path
    model = ns.model_path or ""
    return ServeArgs(
        model=model, served_names=(ns.served_model_name or model,),
        tensor_parallel_size=ns.tp_size, pipeline_parallel_size=ns.pp_size,
        nnodes=ns.nnodes, node_rank=ns.node_rank, master_addr=master_addr, master_port=master_port,
        headless=ns.node_rank > 0, host=ns.host, port=ns.port,
        kv_cache_dtype=ns.kv_cache_dtype, block_size=ns.page_size, kv_cache_memory_bytes=None,
        max_model_len=ns.context_length,
        gpu_memory_utilization=ns.mem_fraction_static if ns.mem_fraction_static is not None else 0.9,
        max_num_seqs=ns.max_running_requests if ns.max_running_requests is not None else 256,
        enable_prefix_caching=not ns.disable_radix_cache, enable_chunked_prefill=ns.chunked_prefill_size != -1,
        speculative_config=speculative, load_format=ns.load_format, trust_remote_code=ns.trust_remote_code,
        generation_config="auto", api_key=ns.api_key, disable_log_requests=not ns.log_requests,
        max_num_batched_tokens=ns.chunked_prefill_size, enforce_eager=ns.disable_cuda_graph,
        dtype=ns.dtype, quantization=ns.quantization, seed=ns.random_seed if ns.random_seed is not None else 0,
    )


def parse_args(argv: Sequence[str]) -> tuple[ServeArgs, list[str], argparse.Namespace]:
    """The double's arguments, the problems found, and SGLang's own namespace; argparse exits 2 on a bad flag."""
    ns = build_parser().parse_args(list(argv))
    return serve_args(ns), check(ns), ns


class SGLangMetrics(Metrics):
    """The double's counters under SGLang's names (``sglang:*``, label ``model_name``): the same latency
    histograms as vLLM's, ``sglang:token_usage`` (as ``vllm:kv_cache_usage_perc``) and ``sglang:gen_throughput``
    (tokens per second output over the last few seconds, 0 when no request runs)."""

    def __init__(self, model_name: str, num_speculative_tokens: int, kv_capacity_tokens: int = 0) -> None:
        super().__init__(model_name, num_speculative_tokens, kv_capacity_tokens)
        self._base = [("model_name", model_name)]

    def _core_lines(self) -> list[str]:
        base = self._base
        lines = _family("sglang:num_running_reqs", "gauge", "The number of running requests.",
                        [(base, self.running)])
        lines += _family("sglang:num_queue_reqs", "gauge", "The number of requests in the waiting queue.",
                         [(base, self.waiting)])
        lines += _family("sglang:prompt_tokens_total", "counter", "Number of prefill tokens processed.",
                         [(base, self.prompt_tokens)])
        lines += _family("sglang:generation_tokens_total", "counter", "Number of generation tokens processed.",
                         [(base, self.generation_tokens)])
        lines += _family("sglang:num_requests_total", "counter", "Number of requests processed.",
                         [(base, sum(self.success.values()))])
        lines += _family("sglang:token_usage", "gauge", "Share of the KV token pool held by running requests.",
                         [(base, self._kv_usage())])
        lines += _family("sglang:gen_throughput", "gauge", "Generated tokens per second, recently.",
                         [(base, self._gen_throughput())])
        lines += self._latency_lines("sglang:")
        return lines

    def _spec_lines(self) -> list[str]:
        if not self.k:
            return []
        length = (self.accepted_tokens + self.drafts) / self.drafts if self.drafts else 0.0
        return _family("sglang:spec_accept_length", "gauge", "The average acceptance length of speculative decoding.",
                       [(self._base, length)])


def main(argv: Sequence[str] | None = None) -> int:
    """``python3 -m sglang.launch_server ...``; returns the exit code."""
    args, problems, ns = parse_args(argv if argv is not None else sys.argv[1:])
    flavor = Flavor(engine="sglang", title="SGLang lab double", metrics_enabled=ns.enable_metrics,
                    make_metrics=SGLangMetrics)
    host_ip = os.environ.get("SGLANG_HOST_IP")
    if host_ip and not problems:
        Logger(args.node_rank).info("this node's address for the ranks (SGLANG_HOST_IP): %s" % host_ip)
    return serve(args, problems, flavor)


if __name__ == "__main__":
    sys.exit(main())
