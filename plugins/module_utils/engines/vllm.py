"""vLLM: ``vllm serve`` on every rank, the workers ``--headless``."""

from __future__ import annotations

import re
from typing import Any, Dict, List, Mapping, Optional

from ansible_collections.sparkserve.deploy.plugins.module_utils.engines.base import (
    GIB,
    SAFETENSORS_LOAD_PROGRESS,
    Engine,
    engine_arg,
    fraction_arg,
)

# vLLM's integers with a size suffix (its human_readable_int): k m g t are powers of 1000, K M G T powers of
# 1024 (releases that read M G T as powers of 1000 spell the binary ones Ki Mi Gi Ti). The larger reading is
# taken where releases differ: the estimate errs on the safe side.
_HUMAN_INT = re.compile(r"^(\d+(?:\.\d+)?)(k|m|g|t|K|M|G|T|Ki|Mi|Gi|Ti)?$")
_SIZE_FACTORS = {"k": 10 ** 3, "m": 10 ** 6, "g": 10 ** 9, "t": 10 ** 12,
                 "K": 2 ** 10, "M": 2 ** 20, "G": 2 ** 30, "T": 2 ** 40,
                 "Ki": 2 ** 10, "Mi": 2 ** 20, "Gi": 2 ** 30, "Ti": 2 ** 40}


def _bytes_value(value: Any) -> Optional[int]:
    """A byte count as vLLM reads it (16G, 17179869184), or None when it is not one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value >= 0 else None
    if not isinstance(value, str):
        return None
    match = _HUMAN_INT.match(value.strip())
    if match is None:
        return None
    return int(float(match.group(1)) * _SIZE_FACTORS.get(match.group(2) or "", 1))


class VLLM(Engine):
    name = "vllm"
    owned_flags = {
        "model": "model.path_in_container",
        "served-model-name": "model.served_name",
        "tensor-parallel-size": "parallel.tensor",
        "tp": "parallel.tensor",
        "pipeline-parallel-size": "parallel.pipeline",
        "pp": "parallel.pipeline",
        "nnodes": "the cluster's node count",
        "node-rank": "the node's rank",
        "master-addr": "the head's fabric address",
        "master-port": "launch.master_port",
        "headless": "the node's rank",
        "host": "launch.api_host",
        "port": "launch.api_port",
        "kv-cache-dtype": "kv_cache.dtype",
        "block-size": "kv_cache.block_size",
        "kv-cache-memory-bytes": "kv_cache.memory_gib_per_rank",
    }
    repeated_flags = frozenset({"middleware"})
    json_list_flags = frozenset({"allowed-origins", "allowed-methods", "allowed-headers"})
    host_ip_variable = "VLLM_HOST_IP"
    # vLLM answers /health with 503 and an EngineDeadError once its engine core died (vllm#53157).
    dead_health_pattern = "dead|EngineDeadError"
    fatal_log_patterns = (
        r"EngineDeadError",
        r"Watchdog caught collective operation timeout",
        r"NCCL error",
        r"RuntimeError: Engine core initialization failed",
    )
    # Its safetensors loader's progress bar (one line per shard, redrawn with carriage returns).
    load_progress_pattern = SAFETENSORS_LOAD_PROGRESS
    # The compile cache (torch.compile, CUDA graphs), FlashInfer's JIT kernels and Triton's compiled kernels
    # (a cold start without them took 11 to 17 minutes on a Spark).
    cache_mounts = (("vllm", "/root/.cache/vllm"), ("flashinfer", "/root/.cache/flashinfer"),
                    ("triton", "/root/.triton"))
    metric_names = {
        "generation_tokens": "vllm:generation_tokens",
        "prompt_tokens": "vllm:prompt_tokens",
        "requests_running": "vllm:num_requests_running",
        "requests_waiting": "vllm:num_requests_waiting",
        "kv_cache_usage": "vllm:kv_cache_usage_perc",
        "ttft": "vllm:time_to_first_token_seconds",
        "itl": "vllm:inter_token_latency_seconds",
        "e2e_latency": "vllm:e2e_request_latency_seconds",
        "spec_drafts": "vllm:spec_decode_num_drafts",
        "spec_draft_tokens": "vllm:spec_decode_num_draft_tokens",
        "spec_accepted_tokens": "vllm:spec_decode_num_accepted_tokens",
        "spec_accepted_per_position": "vllm:spec_decode_num_accepted_tokens_per_pos",
        "cache_config_info": "vllm:cache_config_info",
    }
    # gpu-memory-utilization bounds everything vLLM allocates on the GPU, its activations and CUDA graphs
    # included (its profiling run measures them); vLLM's default is 0.9.
    memory_fraction_flag = "gpu-memory-utilization"
    fraction_covers_overhead = True
    default_memory_fraction = 0.9
    # With the KV cache sized in bytes: the CUDA context, the profiled activations of the largest batch and the
    # CUDA graphs (vLLM logs their capture at 0.3-2 GiB); 4 GiB covers them on one GB10.
    overhead_gib = 4.0

    def launch_argv(self, recipe: Mapping[str, Any], rank: int, world_size: int, head_fabric_ip: str) -> List[str]:
        model, parallel, launch = recipe["model"], recipe["parallel"], recipe["launch"]
        argv = ["vllm", "serve", model["path_in_container"], "--served-model-name", model["served_name"],
                *model.get("aliases", []), "--tensor-parallel-size", str(parallel["tensor"]),
                "--pipeline-parallel-size", str(parallel["pipeline"])]
        if world_size > 1:  # one node needs no rendezvous
            argv += ["--nnodes", str(world_size), "--node-rank", str(rank),
                     "--master-addr", head_fabric_ip, "--master-port", str(launch["master_port"])]
        if rank == 0:
            return argv + ["--host", launch["api_host"], "--port", str(launch["api_port"])]
        return argv + ["--headless"]

    def kv_words(self, kv: Mapping[str, Any]) -> List[str]:
        words = super().kv_words(kv)
        if kv.get("block_size") is not None:
            words += ["--block-size", str(kv["block_size"])]
        if kv.get("memory_gib_per_rank") is not None:
            words += ["--kv-cache-memory-bytes", str(int(round(kv["memory_gib_per_rank"] * GIB)))]
        return words

    def environment(self, recipe: Mapping[str, Any]) -> Dict[str, str]:
        # vLLM's own wait for its engine core; the recipe's readiness timeout bounds the load instead.
        return {"VLLM_ENGINE_READY_TIMEOUT_S": str(recipe["readiness"]["timeout_s"])}

    def memory_fraction(self, recipe: Mapping[str, Any]) -> Optional[float]:
        # A KV cache sized in bytes (kv_cache.memory_gib_per_rank renders --kv-cache-memory-bytes) makes vLLM
        # ignore gpu-memory-utilization when it sizes its pool: the need is then weights + KV + overhead.
        # (vLLM still refuses to start unless the node has gpu-memory-utilization of its memory free.)
        args = recipe.get("engine_args")
        args = args if isinstance(args, Mapping) else {}
        kv = recipe.get("kv_cache")
        if isinstance(kv, Mapping) and kv.get("memory_gib_per_rank") is not None:
            return None
        if engine_arg(args, "kv-cache-memory-bytes") is not None:
            return None
        return fraction_arg(args, self.memory_fraction_flag, self.default_memory_fraction)

    def kv_cache_gib(self, recipe: Mapping[str, Any]) -> Optional[float]:
        stated = super().kv_cache_gib(recipe)
        if stated is not None:
            return stated
        args = recipe.get("engine_args")
        size = _bytes_value(engine_arg(args, "kv-cache-memory-bytes")) if isinstance(args, Mapping) else None
        return None if size is None else size / GIB


ENGINE = VLLM()
