"""The ``vllm`` command line: ``vllm serve MODEL [flags]`` and ``vllm --version``.

FLAGS is the one list of the vLLM flags the double accepts: the ones the
sparkserve recipes render or set through ``engine_args``. Any other flag is
refused the way vLLM's argparse refuses it ("unrecognized arguments", exit 2).
Its flags are vLLM 0.31.0's (plugins/module_utils/engines/flags/vllm-0.31.0.json,
a test keeps them so). As in vLLM, ``--flag_name`` means ``--flag-name``;
prefixes of long flags are not expanded (vLLM expands them; recipe validation
refuses them before they get here); true/false options also take a ``--no-`` form, and integer sizes
take human suffixes (``32k`` = 32000, ``8G`` = 8 GiB).
"""

from __future__ import annotations

import argparse
import json
import re
from dataclasses import dataclass
from typing import Any, Sequence

from . import VERSION

DTYPES = ("auto", "half", "float16", "bfloat16", "float", "float32")


@dataclass(frozen=True)
class Flag:
    """One accepted flag: its names, how its value is read, its default."""

    names: tuple[str, ...]
    kind: str  # str, int, human_int, float, bool, json, store_true, names
    default: Any
    help: str
    choices: tuple[str, ...] | None = None


FLAGS: tuple[Flag, ...] = (
    Flag(("--served-model-name",), "names", None, "Names clients use for the model (the first one labels metrics)."),
    Flag(("--tensor-parallel-size", "-tp"), "int", 1, "Tensor-parallel size."),
    Flag(("--pipeline-parallel-size", "-pp"), "int", 1, "Pipeline-parallel size."),
    Flag(("--nnodes", "-n"), "int", 1, "Number of nodes (processes) in the rendezvous."),
    Flag(("--node-rank", "-r"), "int", 0, "This node's rank; 0 is the head."),
    Flag(("--master-addr",), "str", "127.0.0.1", "The head's address, where workers join."),
    Flag(("--master-port",), "int", 29501, "The head's rendezvous port."),
    Flag(("--headless",), "store_true", False, "Run without the API server (every rank but 0)."),
    Flag(("--host",), "str", None, "Address the API binds to (all interfaces when unset)."),
    Flag(("--port",), "int", 8000, "Port of the API."),
    Flag(("--kv-cache-dtype",), "str", "auto", "KV cache data type (recorded only)."),
    Flag(("--block-size",), "int", None, "Tokens per KV block (recorded only)."),
    Flag(("--kv-cache-memory-bytes",), "human_int", None, "Fixed KV cache size per rank (recorded only)."),
    Flag(("--max-model-len",), "human_int", None, "Context length; default from config.json."),
    Flag(("--gpu-memory-utilization",), "float", 0.9, "Fraction of GPU memory (recorded only)."),
    Flag(("--max-num-seqs",), "int", None, "Requests run at once; the rest wait (default 256)."),
    Flag(("--enable-prefix-caching",), "bool", None, "Prefix caching (recorded only)."),
    Flag(("--enable-chunked-prefill",), "bool", None, "Chunked prefill (recorded only)."),
    Flag(("--speculative-config",), "json", None, "Speculative decoding, a JSON object with num_speculative_tokens."),
    Flag(("--load-format",), "str", "auto", "Weight format; 'dummy' skips reading the weights."),
    Flag(("--trust-remote-code",), "bool", False, "Trust remote code (recorded only)."),
    Flag(("--generation-config",), "str", "auto", "Where generation defaults come from (recorded only)."),
    Flag(("--api-key",), "str", None, "Key required on /v1/* (also VLLM_API_KEY)."),
    Flag(("--enable-log-requests",), "bool", False, "Log each request."),
    Flag(("--max-num-batched-tokens",), "human_int", None, "Tokens per engine step (recorded only)."),
    Flag(("--enforce-eager",), "bool", False, "No CUDA graphs (recorded only)."),
    Flag(("--dtype",), "str", "auto", "Weight data type (recorded only).", DTYPES),
    Flag(("--quantization", "-q"), "str", None, "Quantization method (recorded only)."),
    Flag(("--seed",), "int", None, "Seed of the generated text and of speculative acceptance."),
)

_DECIMAL = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_BINARY = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
_HUMAN_INT = re.compile(r"(-?\d+(?:\.\d+)?)([kmgtKMGT]?)")


def human_int(text: str) -> int:
    """An integer with an optional suffix: k m g t are powers of 1000, K M G T of 1024."""
    match = _HUMAN_INT.fullmatch(text.strip())
    if match is None:
        raise argparse.ArgumentTypeError("invalid integer %r (examples: 4096, 32k, 8G)" % text)
    number, suffix = match.groups()
    if suffix in _DECIMAL:
        return int(float(number) * _DECIMAL[suffix])
    if "." in number:
        raise argparse.ArgumentTypeError("invalid integer %r: decimals need a k/m/g/t suffix" % text)
    return int(number) * _BINARY.get(suffix, 1)


def json_object(text: str) -> dict[str, Any]:
    """A JSON object given as one command-line word."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError("invalid JSON %r: %s" % (text, exc)) from exc
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("%r is not a JSON object" % text)
    return value


_KIND_OPTIONS: dict[str, dict[str, Any]] = {
    "str": {"type": str},
    "int": {"type": int},
    "human_int": {"type": human_int},
    "float": {"type": float},
    "bool": {"action": argparse.BooleanOptionalAction},
    "json": {"type": json_object},
    "store_true": {"action": "store_true"},
    "names": {"type": str, "nargs": "+"},
}


def _add_flag(parser: argparse.ArgumentParser, flag: Flag) -> None:
    options = dict(_KIND_OPTIONS[flag.kind], default=flag.default, help=flag.help)
    if flag.choices is not None:
        options["choices"] = flag.choices
    parser.add_argument(*flag.names, **options)


def build_parser() -> argparse.ArgumentParser:
    """The ``vllm`` parser with its ``serve`` subcommand."""
    parser = argparse.ArgumentParser(prog="vllm", allow_abbrev=False,
                                     description="vLLM lab double (sparkserve); not vLLM.")
    parser.add_argument("-v", "--version", action="version", version=VERSION)
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", allow_abbrev=False, help="Serve a model (lab double).")
    serve.add_argument("model_tag", help="Folder of the model's weights.")
    for flag in FLAGS:
        _add_flag(serve, flag)
    return parser


def normalize(argv: Sequence[str]) -> list[str]:
    """``--flag_name[=value]`` as ``--flag-name[=value]``, as vLLM's parser does."""
    words: list[str] = []
    for word in argv:
        if word.startswith("--") and len(word) > 2:
            key, sep, value = word.partition("=")
            word = key.replace("_", "-") + sep + value
        words.append(word)
    return words


@dataclass(frozen=True)
class ServeArgs:
    """What ``vllm serve`` was asked to do, with vLLM's defaults filled in."""

    model: str
    served_names: tuple[str, ...]
    tensor_parallel_size: int
    pipeline_parallel_size: int
    nnodes: int
    node_rank: int
    master_addr: str
    master_port: int
    headless: bool
    host: str | None
    port: int
    kv_cache_dtype: str
    block_size: int | None
    kv_cache_memory_bytes: int | None
    max_model_len: int | None
    gpu_memory_utilization: float
    max_num_seqs: int
    enable_prefix_caching: bool | None
    enable_chunked_prefill: bool | None
    speculative_config: dict[str, Any] | None
    load_format: str
    trust_remote_code: bool
    generation_config: str
    api_key: str | None
    disable_log_requests: bool
    max_num_batched_tokens: int | None
    enforce_eager: bool
    dtype: str
    quantization: str | None
    seed: int

    @property
    def head(self) -> bool:
        return self.node_rank == 0

    @property
    def served_name(self) -> str:
        return self.served_names[0]

    @property
    def num_speculative_tokens(self) -> int:
        if not self.speculative_config:
            return 0
        return int(self.speculative_config.get("num_speculative_tokens") or 0)


def _serve_args(ns: argparse.Namespace) -> ServeArgs:
    names = tuple(ns.served_model_name) if ns.served_model_name else (ns.model_tag,)
    return ServeArgs(
        model=ns.model_tag, served_names=names,
        tensor_parallel_size=ns.tensor_parallel_size, pipeline_parallel_size=ns.pipeline_parallel_size,
        nnodes=ns.nnodes, node_rank=ns.node_rank, master_addr=ns.master_addr, master_port=ns.master_port,
        headless=ns.headless, host=ns.host, port=ns.port,
        kv_cache_dtype=ns.kv_cache_dtype, block_size=ns.block_size,
        kv_cache_memory_bytes=ns.kv_cache_memory_bytes, max_model_len=ns.max_model_len,
        gpu_memory_utilization=ns.gpu_memory_utilization,
        max_num_seqs=ns.max_num_seqs if ns.max_num_seqs is not None else 256,
        enable_prefix_caching=ns.enable_prefix_caching, enable_chunked_prefill=ns.enable_chunked_prefill,
        speculative_config=ns.speculative_config, load_format=ns.load_format,
        trust_remote_code=ns.trust_remote_code, generation_config=ns.generation_config,
        api_key=ns.api_key, disable_log_requests=not ns.enable_log_requests,
        max_num_batched_tokens=ns.max_num_batched_tokens, enforce_eager=ns.enforce_eager,
        dtype=ns.dtype, quantization=ns.quantization, seed=ns.seed if ns.seed is not None else 0,
    )


def parse_args(argv: Sequence[str]) -> ServeArgs:
    """Parse ``serve MODEL [flags]``; argparse exits 2 on an unknown or malformed flag."""
    ns = build_parser().parse_args(normalize(argv))
    return _serve_args(ns)


def check_args(args: ServeArgs) -> list[str]:
    """Problems vLLM would find when it builds its config (it then exits 1)."""
    problems: list[str] = []
    for name in ("tensor_parallel_size", "pipeline_parallel_size", "nnodes", "max_num_seqs"):
        if getattr(args, name) < 1:
            problems.append("--%s is %d; it must be at least 1" % (name.replace("_", "-"), getattr(args, name)))
    if not 0 <= args.node_rank < max(args.nnodes, 1):
        problems.append("--node-rank is %d; with --nnodes %d it must be from 0 to %d"
                        % (args.node_rank, args.nnodes, args.nnodes - 1))
    world = args.tensor_parallel_size * args.pipeline_parallel_size
    if args.nnodes >= 1 and world % args.nnodes:
        problems.append("tensor-parallel-size x pipeline-parallel-size (%d) is not a multiple of --nnodes %d"
                        % (world, args.nnodes))
    if args.node_rank > 0 and not args.headless:
        problems.append("--node-rank %d needs --headless: only rank 0 serves the API" % args.node_rank)
    if args.node_rank == 0 and args.headless:
        problems.append("--headless on --node-rank 0: the head serves the API")
    if not 1 <= args.master_port <= 65535 or not 1 <= args.port <= 65535:
        problems.append("--port and --master-port must be from 1 to 65535")
    if not 0 < args.gpu_memory_utilization <= 1:
        problems.append("--gpu-memory-utilization is %g; it must be in (0, 1]" % args.gpu_memory_utilization)
    if args.max_model_len is not None and args.max_model_len < 1 and args.max_model_len != -1:
        problems.append("--max-model-len is %d; it must be at least 1" % args.max_model_len)
    problems.extend(_check_speculative(args.speculative_config))
    return problems


def _check_speculative(config: dict[str, Any] | None) -> list[str]:
    if config is None:
        return []
    count = config.get("num_speculative_tokens")
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        return ["--speculative-config needs num_speculative_tokens, a positive integer (got %r)" % (count,)]
    return []
