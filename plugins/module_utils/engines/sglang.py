"""SGLang: ``python3 -m sglang.launch_server`` on every rank, the API on the head only."""

from __future__ import annotations

from typing import Any, List, Mapping, Optional

from ansible_collections.sparkserve.deploy.plugins.module_utils.engines.base import (
    SAFETENSORS_LOAD_PROGRESS,
    Engine,
    Problem,
    engine_arg,
    flag_is_set,
    fraction_arg,
)


class SGLang(Engine):
    name = "sglang"
    owned_flags = {
        "model-path": "model.path_in_container",
        "model": "model.path_in_container",
        "served-model-name": "model.served_name",
        "tp-size": "parallel.tensor",
        "tp": "parallel.tensor",
        "tensor-parallel-size": "parallel.tensor",
        "pp-size": "parallel.pipeline",
        "pp": "parallel.pipeline",
        "pipeline-parallel-size": "parallel.pipeline",
        "nnodes": "the cluster's node count",
        "node-rank": "the node's rank",
        "dist-init-addr": "the head's fabric address and launch.master_port",
        "host": "launch.api_host",
        "port": "launch.api_port",
        "kv-cache-dtype": "kv_cache.dtype",
        "page-size": "kv_cache.block_size",
    }
    host_ip_variable = "SGLANG_HOST_IP"
    dead_health_pattern = "dead|EngineDeadError|unhealthy"
    fatal_log_patterns = (
        r"Watchdog caught collective operation timeout",
        r"NCCL error",
        r"Scheduler hit an exception",
        r"Received sigquit from a child process",
    )
    # Its safetensors loader's progress bar (one line per shard, redrawn with carriage returns).
    load_progress_pattern = SAFETENSORS_LOAD_PROGRESS
    # FlashInfer's JIT kernels and Triton's compiled kernels; SGLang keeps no compile cache of its own under
    # ~/.cache.
    cache_mounts = (("flashinfer", "/root/.cache/flashinfer"), ("triton", "/root/.triton"))
    metric_names = {
        "generation_tokens": "sglang:generation_tokens",
        "prompt_tokens": "sglang:prompt_tokens",
        "requests_running": "sglang:num_running_reqs",
        "requests_waiting": "sglang:num_queue_reqs",
        "kv_cache_usage": "sglang:token_usage",
        "ttft": "sglang:time_to_first_token_seconds",
        "itl": "sglang:inter_token_latency_seconds",
        "e2e_latency": "sglang:e2e_request_latency_seconds",
        "spec_accept_length": "sglang:spec_accept_length",
    }
    # mem-fraction-static is the share of the GPU's memory for the weights and the KV pool only; SGLang leaves
    # the rest for activations and CUDA graphs, so the estimate adds overhead_gib on top of the fraction.
    memory_fraction_flag = "mem-fraction-static"
    fraction_covers_overhead = False
    # SGLang's default is computed at start (ServerArgs._handle_gpu_memory_settings): (memory - reserved) /
    # memory, reserved about 13-16 GiB on a 121 GiB GB10 (chunked prefill 8192 x 1.5 MiB, CUDA graphs, 1 GiB
    # per 8 ranks, 2 GiB more with speculative decoding), which gives 0.87-0.89; 0.88 is the figure it falls
    # back to when it cannot read the GPU's memory, and the middle of that range.
    default_memory_fraction = 0.88
    # Its activations of a chunked-prefill step (8192 tokens by default on a GPU this size) and its CUDA
    # graphs, beyond the static fraction: 4 GiB, conservative for one GB10.
    overhead_gib = 4.0
    # With --dist-init-addr HEAD:PORT the head also listens on PORT+1 to PORT+6 (PortArgs.init_new: the
    # tokenizer, scheduler, detokenizer, RPC, metrics and broadcast sockets).
    master_port_span = 7

    def launch_argv(self, recipe: Mapping[str, Any], rank: int, world_size: int, head_fabric_ip: str) -> List[str]:
        model, parallel, launch = recipe["model"], recipe["parallel"], recipe["launch"]
        argv = ["python3", "-m", "sglang.launch_server", "--model-path", model["path_in_container"],
                "--served-model-name", model["served_name"],
                "--tp-size", str(parallel["tensor"]), "--pp-size", str(parallel["pipeline"])]
        if world_size > 1:  # one node needs no rendezvous
            host = "[%s]" % head_fabric_ip if ":" in head_fabric_ip else head_fabric_ip
            argv += ["--nnodes", str(world_size), "--node-rank", str(rank),
                     "--dist-init-addr", "%s:%d" % (host, launch["master_port"])]
        if rank == 0:
            argv += ["--host", launch["api_host"], "--port", str(launch["api_port"])]
        return argv

    def kv_words(self, kv: Mapping[str, Any]) -> List[str]:
        words = super().kv_words(kv)
        if kv.get("block_size") is not None:
            words += ["--page-size", str(kv["block_size"])]
        return words

    def problems(self, recipe: Mapping[str, Any]) -> List[Problem]:
        kv = recipe.get("kv_cache")
        kv = kv if isinstance(kv, dict) else {}
        found: List[Problem] = []
        if kv.get("dtype") == "fp8":
            found.append(("kv_cache.dtype", kv["dtype"],
                          "SGLang names the FP8 formats fp8_e4m3 and fp8_e5m2; give one of them"))
        if kv.get("memory_gib_per_rank") is not None:
            found.append(("kv_cache.memory_gib_per_rank", kv["memory_gib_per_rank"],
                          "SGLang has no flag for a KV cache size in bytes; remove it and size the pool "
                          "with engine_args max-total-tokens or mem-fraction-static"))
        aliases = recipe.get("model", {}).get("aliases") if isinstance(recipe.get("model"), dict) else None
        if aliases:
            found.append(("model.aliases", aliases,
                          "SGLang serves one name (its --served-model-name takes one value); remove the aliases, "
                          "or serve the model with vLLM, which takes several"))
        return found

    def metrics_served(self, recipe: Mapping[str, Any]) -> bool:
        # SGLang serves /metrics only when started with --enable-metrics.
        args = recipe.get("engine_args")
        return flag_is_set(args if isinstance(args, dict) else {}, "enable-metrics")

    def memory_fraction(self, recipe: Mapping[str, Any]) -> Optional[float]:
        # max-total-tokens caps the KV pool below what the fraction would give: the fraction no longer says the
        # need (the estimate then sums weights, the stated KV cache and the overhead).
        args = recipe.get("engine_args")
        args = args if isinstance(args, Mapping) else {}
        if engine_arg(args, "max-total-tokens") not in (None, False):
            return None
        return fraction_arg(args, self.memory_fraction_flag, self.default_memory_fraction)


ENGINE = SGLang()
