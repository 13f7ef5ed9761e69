"""vLLM: ``vllm serve`` on every rank, the workers ``--headless``."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping

from ansible_collections.sparkserve.deploy.plugins.module_utils.engines.base import (
    GIB,
    SAFETENSORS_LOAD_PROGRESS,
    Engine,
)


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
    # The compile cache (torch.compile, CUDA graphs) and FlashInfer's JIT kernels.
    cache_mounts = (("vllm", "/root/.cache/vllm"), ("flashinfer", "/root/.cache/flashinfer"))
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

    def launch_argv(self, recipe: Mapping[str, Any], rank: int, world_size: int, head_fabric_ip: str) -> List[str]:
        model, parallel, launch = recipe["model"], recipe["parallel"], recipe["launch"]
        argv = ["vllm", "serve", model["path_in_container"], "--served-model-name", model["served_name"],
                "--tensor-parallel-size", str(parallel["tensor"]),
                "--pipeline-parallel-size", str(parallel["pipeline"]),
                "--nnodes", str(world_size), "--node-rank", str(rank),
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


ENGINE = VLLM()
