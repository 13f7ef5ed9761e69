"""What an engine adapter declares: everything specific to one serving engine.

An adapter is one module of this package (``vllm.py``, ``sglang.py``) holding
one ``Engine``. The recipe's validation and render, the roles and the modules
read an engine only through it, or through what the render carries from it
(``Engine.facts``). Adding an engine is one new module and one line in
``engines/__init__.py``; README.md has the checklist.

Pure standard library: this runs on the controller and on the nodes.
"""

from __future__ import annotations

import json
from typing import Any, Dict, FrozenSet, List, Mapping, Optional, Tuple

GIB = 1024 ** 3

# A problem of a recipe for this engine: (field path, value, how to fix it).
Problem = Tuple[str, Any, str]


def flag_is_set(args: Mapping[str, Any], flag: str) -> bool:
    """Whether engine_args turns the bare flag FLAG on (keys compared with - for _)."""
    return any(isinstance(k, str) and k.replace("_", "-") == flag and v is True for k, v in args.items())


def engine_arg(args: Mapping[str, Any], flag: str) -> Any:
    """The value engine_args gives the flag FLAG (keys compared with - for _), None when it is absent."""
    for key, value in args.items():
        if isinstance(key, str) and key.replace("_", "-") == flag:
            return value
    return None


def fraction_arg(args: Mapping[str, Any], flag: str, default: float) -> float:
    """engine_args' value of the memory fraction FLAG, a number above 0 and at most 1; DEFAULT when it is
    absent or not such a number (the recipe's validation reports a bad value, the estimate stays safe)."""
    value = engine_arg(args, flag)
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        return default
    return float(value)


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


# What an adapter's metric_names may map, by meaning, to its engine's metric (counters without _total,
# histograms without _bucket/_sum/_count): the bench reads the speculative decoding and cache meanings,
# the monitoring's recording rules (roles/monitoring) every one of them.
METRIC_MEANINGS: Mapping[str, str] = {
    "generation_tokens": "counter: tokens generated",
    "prompt_tokens": "counter: prompt tokens prefilled",
    "requests_running": "gauge: requests being generated",
    "requests_waiting": "gauge: requests queued",
    "kv_cache_usage": "gauge: share of the KV cache in use, 0 to 1",
    "ttft": "histogram: seconds from a request's arrival to its first token",
    "itl": "histogram: seconds between two outputs of a request",
    "e2e_latency": "histogram: seconds from a request's arrival to its end",
    "spec_drafts": "counter: speculative decoding drafts",
    "spec_draft_tokens": "counter: draft tokens proposed",
    "spec_accepted_tokens": "counter: draft tokens accepted",
    "spec_accepted_per_position": "counter: draft tokens accepted, by draft position (label position)",
    "spec_accept_length": "gauge: mean tokens per step with speculative decoding",
    "cache_config_info": "info: the KV cache's configuration as labels",
}


# vLLM's and SGLang's safetensors loader bar: "Loading safetensors checkpoint shards:  50% Completed | 1/2 [...]".
SAFETENSORS_LOAD_PROGRESS = r"Loading safetensors checkpoint shards:\s*\d+% Completed \| (?P<done>\d+)/(?P<total>\d+)"


# NCCL's INFO lines of its init and network (which network, which devices, each channel's transport), a few
# dozen lines per rank at start-up: read by the launch (module rank_transport) and the supervisor.
NCCL_REPORT_ENV = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET"}

class Engine:
    """The base of every adapter; a subclass sets the class attributes and ``launch_argv``."""

    # The recipe's ``engine`` value.
    name: str = ""
    # Flags sparkserve renders itself, without dashes, each with the recipe field that sets it;
    # engine_args may not repeat them.
    owned_flags: Mapping[str, str] = {}
    # List-valued flags passed once per value (argparse append) and as one JSON list.
    repeated_flags: FrozenSet[str] = frozenset()
    json_list_flags: FrozenSet[str] = frozenset()
    # The environment variable that tells the engine which address is the node's own on the fabric.
    host_ip_variable: str = ""
    # The head's HTTP paths: liveness, the model list, the one-token completion, Prometheus metrics.
    health_path: str = "/health"
    models_path: str = "/v1/models"
    completions_path: str = "/v1/completions"
    metrics_path: str = "/metrics"
    # A 5xx body of the health path that means the engine is dead (a Python regular expression).
    dead_health_pattern: str = ""
    # Log lines that mean a rank is dead whatever its container says (Python regular expressions).
    fatal_log_patterns: Tuple[str, ...] = ()
    # The rank's own weight-loading progress line (a Python regular expression with the groups done and
    # total), read from its log while the launch waits; empty when the engine prints none.
    load_progress_pattern: str = ""
    # Host folders kept across restarts: (name under the node's cache folder, path in the container).
    cache_mounts: Tuple[Tuple[str, str], ...] = ()
    # Its metrics by meaning (METRIC_MEANINGS) for the bench and the monitoring; a meaning the engine
    # lacks is absent.
    metric_names: Mapping[str, str] = {}
    # The engine flag of its memory fraction (memory_fraction), named in the memory estimate's basis.
    memory_fraction_flag: str = ""
    # Whether that fraction bounds everything the engine allocates (vLLM's gpu-memory-utilization does) or
    # only its weights and KV cache, its activations and CUDA graphs coming on top (SGLang's
    # mem-fraction-static): then the estimate adds overhead_gib to the fraction's share.
    fraction_covers_overhead: bool = True
    # The engine's own memory on a node beyond the weights and the KV cache, in GiB: the CUDA context (about
    # 0.5-1 GiB), the activations of the largest prefill chunk, the CUDA graphs (vLLM logs 0.3-2 GiB for
    # their capture), NCCL's buffers and the sampler. 4 GiB is a conservative round figure for vLLM and
    # SGLang on one GPU; the estimate adds it where no memory fraction bounds the whole (fleet/memory.py).
    overhead_gib: float = 4.0
    # TCP ports the head takes from launch.master_port up (the rendezvous and the ports the engine derives
    # from it); two deployments sharing a node need ranges that do not overlap (fleet/ports.py).
    master_port_span: int = 1

    def memory_fraction(self, recipe: Mapping[str, Any]) -> Optional[float]:
        """The fraction of the node's whole memory the engine reserves for weights, KV cache and activations.

        On a Spark's unified memory the fraction is of the whole memory. None when the recipe sizes the KV
        cache itself and the engine then ignores its fraction: the need is the weights, the KV cache and
        ``overhead_gib``. ``recipe`` is the raw mapping, perhaps invalid: read it defensively.
        """
        return None

    def kv_cache_gib(self, recipe: Mapping[str, Any]) -> Optional[float]:
        """The KV cache per rank, in GiB, that the recipe states (kv_cache.memory_gib_per_rank); None if none."""
        kv = recipe.get("kv_cache")
        value = kv.get("memory_gib_per_rank") if isinstance(kv, Mapping) else None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            return None
        return float(value)

    def launch_argv(self, recipe: Mapping[str, Any], rank: int, world_size: int, head_fabric_ip: str) -> List[str]:
        """The command line up to the KV cache and engine_args words: program, model, parallelism, rendezvous, API."""
        raise NotImplementedError

    def kv_words(self, kv: Mapping[str, Any]) -> List[str]:
        """The words of the recipe's kv_cache section (checked by ``problems`` first)."""
        return ["--kv-cache-dtype", str(kv["dtype"])] if kv.get("dtype") is not None else []

    def problems(self, recipe: Mapping[str, Any]) -> List[Problem]:
        """What this engine cannot run in a recipe that passed the schema."""
        return []

    def environment(self, recipe: Mapping[str, Any]) -> Dict[str, str]:
        """The render's own environment for every rank, before the recipe's env."""
        return {}

    def network_report_environment(self, world_size: int) -> Dict[str, str]:
        """What makes NCCL say, in every rank's log, which network it chose between the nodes (the launch reads
        it: fabric.require_rdma); nothing on one node. vLLM and SGLang both run NCCL."""
        return dict(NCCL_REPORT_ENV) if world_size > 1 else {}

    def metrics_served(self, recipe: Mapping[str, Any]) -> bool:
        """Whether the head serves the metrics path with this recipe."""
        return True

    def endpoints(self, recipe: Mapping[str, Any]) -> Dict[str, Optional[str]]:
        """The head's HTTP paths; metrics is None when the head does not serve them."""
        return {"health": self.health_path, "models": self.models_path, "completions": self.completions_path,
                "metrics": self.metrics_path if self.metrics_served(recipe) else None}

    def args_words(self, args: Mapping[str, Any]) -> List[str]:
        """engine_args as command-line words, in their order.

        true gives a bare flag; false and null leave the flag out; a mapping is
        passed as one JSON word; a list follows the engine's reading of that
        flag: one flag then every value (most list options), one flag per
        value, or one JSON list.
        """
        words: List[str] = []
        for key, value in args.items():
            flag, norm = "--" + key, key.replace("_", "-")
            if value is None or value is False or (isinstance(value, list) and not value):
                continue
            if value is True:
                words.append(flag)
            elif isinstance(value, dict) or (isinstance(value, list) and norm in self.json_list_flags):
                words += [flag, json.dumps(value, separators=(",", ":"))]
            elif isinstance(value, list) and norm in self.repeated_flags:
                for item in value:
                    words += [flag, _scalar(item)]
            elif isinstance(value, list):
                words += [flag] + [_scalar(item) for item in value]
            else:
                words += [flag, _scalar(value)]
        return words

    def facts(self, recipe: Mapping[str, Any]) -> Dict[str, Any]:
        """What the roles and modules need of the engine, carried by the render (plain data)."""
        return {
            "name": self.name,
            "host_ip_variable": self.host_ip_variable,
            "endpoints": self.endpoints(recipe),
            "dead_health_pattern": self.dead_health_pattern,
            "fatal_log_patterns": list(self.fatal_log_patterns),
            "load_progress_pattern": self.load_progress_pattern,
            "cache_mounts": [{"name": name, "container_path": path} for name, path in self.cache_mounts],
            "metric_names": dict(self.metric_names),
        }
