"""fleet.memory: a deployment's memory need per node, the hub's revision sizes and their cache.

The figures are the seeds' and the field notes' (../shared/seeds/000_*, ../shared/FIELD_NOTES.md): a Spark
has about 121 GiB of usable unified memory; seed 000 serves GLM-5.3-Flash NVFP4 (182 GB of weights over TP4,
about 45 GiB per node, and a 2.2 GiB DFlash2 drafter) through vLLM at gpu-memory-utilization 0.75.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator

import pytest

from ansible_collections.sparkserve.deploy.plugins.module_utils.engines import ENGINES
from ansible_collections.sparkserve.deploy.plugins.module_utils.fleet.memory import (
    Need,
    SizeUnknown,
    default_cache_path,
    docker_size_bytes,
    estimate,
    hub_revision_bytes,
    weights_bytes_of,
)
from ansible_collections.sparkserve.deploy.plugins.module_utils.recipe.validate import validate_recipe

GIB = 1024 ** 3
SPARK_GIB = 121.0  # FIELD_NOTES, "Hardware": about 121 GiB usable of a Spark's 128 GB
COMMIT = "76348ddb2be2e35e39ecfc00e75dc07703f4f3d5"
DRAFT_COMMIT = "0123456789abcdef0123456789abcdef01234567"


def vllm_recipe(**engine_args: Any) -> dict[str, Any]:
    """Seed 000's shape: vLLM at TP4, one GB10 per node."""
    return {"name": "glm53-nvfp4-dflash2-tp4", "engine": "vllm",
            "parallel": {"tensor": 4, "pipeline": 1, "gpus_per_node": 1},
            "engine_args": dict(engine_args)}


def test_vllm_gpu_memory_utilization_of_the_whole_memory() -> None:
    # Seed 000's v2 runs at 0.75: 0.75 x 121 = 90.75 GiB per node.
    need = estimate(vllm_recipe(**{"gpu-memory-utilization": 0.75}), SPARK_GIB, None)
    assert need.gib == pytest.approx(90.75)
    assert need.basis == "gpu-memory-utilization 0.75 of 121 GiB"
    # Its v3 tried 0.80: 96.8 GiB.
    need = estimate(vllm_recipe(**{"gpu-memory-utilization": 0.80}), SPARK_GIB, None)
    assert need.gib == pytest.approx(96.8)
    assert need.basis == "gpu-memory-utilization 0.80 of 121 GiB"


def test_vllm_default_fraction_and_underscored_or_string_values() -> None:
    need = estimate(vllm_recipe(), SPARK_GIB, None)  # vLLM's default, 0.9
    assert need.gib == pytest.approx(108.9) and need.basis == "gpu-memory-utilization 0.90 of 121 GiB"
    assert estimate(vllm_recipe(gpu_memory_utilization=0.5), 100.0, None).gib == pytest.approx(50.0)
    assert estimate(vllm_recipe(**{"gpu-memory-utilization": "0.6"}), 100.0, None).gib == pytest.approx(60.0)
    # A value no engine accepts: the validation refuses it; the estimate takes the default meanwhile.
    assert estimate(vllm_recipe(**{"gpu-memory-utilization": 7}), 100.0, None).gib == pytest.approx(90.0)


def test_vllm_kv_cache_in_bytes_is_weights_plus_kv_plus_overhead() -> None:
    # Seed 000: 182 GB of NVFP4 weights, "~45 GiB per node" over TP4 (182 GiB / 4 = 45.5), and the DFlash2
    # drafter of 2.2 GiB; its v3 pinned a 16 GiB KV cache (--kv-cache-memory 16GiB). With the KV cache sized
    # in bytes vLLM ignores gpu-memory-utilization, so the need is weights per rank + KV + vLLM's 4 GiB.
    model = weights_bytes_of([{"rfilename": f"model-{i:05d}-of-00120.safetensors", "size": 182 * GIB // 120}
                              for i in range(120)] + [{"rfilename": "config.json", "size": 2048}])
    draft = int(2.2 * GIB)
    recipe = vllm_recipe(**{"gpu-memory-utilization": 0.75})
    recipe["kv_cache"] = {"dtype": "fp8_e4m3", "memory_gib_per_rank": 16}
    need = estimate(recipe, SPARK_GIB, model + draft)
    weights_per_rank = (model + draft) / GIB / 4  # 46.05 GiB
    assert weights_per_rank == pytest.approx(46.05, abs=0.01)
    assert need.gib == pytest.approx(weights_per_rank + 16 + ENGINES["vllm"].overhead_gib)
    assert need.gib == pytest.approx(66.05, abs=0.01)
    assert need.basis == ("weights 46.05 GiB per rank (184.2 GiB over 4 ranks) + KV cache 16 GiB + 4 GiB engine "
                          "overhead")


def test_vllm_kv_cache_memory_bytes_in_engine_args() -> None:
    # vLLM reads 16G as 16 x 2**30 (its upper-case suffixes are binary), 16g as 16 x 10**9.
    recipe = vllm_recipe(**{"kv-cache-memory-bytes": "16G"})
    assert estimate(recipe, SPARK_GIB, 40 * GIB).gib == pytest.approx(10 + 16 + 4)
    recipe = vllm_recipe(**{"kv-cache-memory-bytes": "16g"})
    assert estimate(recipe, SPARK_GIB, 40 * GIB).gib == pytest.approx(10 + 16e9 / GIB + 4)
    recipe = vllm_recipe(kv_cache_memory_bytes=8 * GIB)
    assert estimate(recipe, SPARK_GIB, 40 * GIB).gib == pytest.approx(10 + 8 + 4)


def test_memory_limit_caps_the_estimate() -> None:
    recipe = vllm_recipe(**{"gpu-memory-utilization": 0.95})  # 114.95 GiB
    recipe["launch"] = {"memory_limit": "110g"}
    need = estimate(recipe, SPARK_GIB, None)
    assert need.gib == pytest.approx(110.0)
    assert need.basis == ("launch.memory_limit 110g (110 GiB) caps gpu-memory-utilization 0.95 of 121 GiB "
                          "(114.95 GiB)")
    recipe["launch"] = {"memory_limit": "512m"}
    assert estimate(recipe, SPARK_GIB, None).gib == pytest.approx(0.5)
    # A cap above the estimate changes nothing.
    recipe["launch"] = {"memory_limit": "120g"}
    need = estimate(recipe, SPARK_GIB, None)
    assert need.gib == pytest.approx(114.95) and need.basis == "gpu-memory-utilization 0.95 of 121 GiB"


def test_docker_sizes() -> None:
    assert docker_size_bytes("110g") == 110 * GIB
    assert docker_size_bytes("512m") == 512 * 1024 ** 2
    assert docker_size_bytes("64K") == 64 * 1024
    assert docker_size_bytes("1000") == 1000
    assert docker_size_bytes("1000b") == 1000
    for bad in ("110GiB", "", "-1g", "0", None, True, 1.5):
        assert docker_size_bytes(bad) is None


def test_sglang_mem_fraction_static_plus_its_overhead() -> None:
    recipe = {"name": "lab-sglang-tp2", "engine": "sglang", "parallel": {"tensor": 2},
              "engine_args": {"mem-fraction-static": 0.8}}
    # mem-fraction-static covers the weights and the KV pool; activations and CUDA graphs come on top.
    need = estimate(recipe, SPARK_GIB, None)
    assert need.gib == pytest.approx(0.8 * 121 + 4)
    assert need.basis == "mem-fraction-static 0.80 of 121 GiB + 4 GiB engine overhead"
    del recipe["engine_args"]
    need = estimate(recipe, SPARK_GIB, None)  # SGLang's default on a GB10, 0.88
    assert need.gib == pytest.approx(0.88 * 121 + 4)
    assert need.basis == "mem-fraction-static 0.88 of 121 GiB + 4 GiB engine overhead"


def test_sglang_max_total_tokens_sizes_by_weights() -> None:
    recipe = {"name": "s", "engine": "sglang", "parallel": {"tensor": 2},
              "engine_args": {"mem-fraction-static": 0.8, "max-total-tokens": 65536}}
    with pytest.raises(SizeUnknown):
        estimate(recipe, SPARK_GIB, None)
    need = estimate(recipe, SPARK_GIB, 60 * GIB)
    assert need.gib == pytest.approx(30 + 4)
    assert "KV cache not stated" in need.basis


def test_budget_gib_wins_and_needs_no_weights() -> None:
    recipe = vllm_recipe(**{"gpu-memory-utilization": 0.75})
    recipe["memory"] = {"budget_gib": 70}
    recipe["kv_cache"] = {"memory_gib_per_rank": 16}
    assert estimate(recipe, SPARK_GIB, None) == Need(gib=70.0,
                                                     basis="memory.budget_gib 70 GiB (the recipe's own figure)")
    # The container cap still applies.
    recipe["launch"] = {"memory_limit": "64g"}
    assert estimate(recipe, SPARK_GIB, None).gib == pytest.approx(64.0)
    # A budget that is no positive number is ignored (the validation refuses it).
    recipe = vllm_recipe(**{"gpu-memory-utilization": 0.5})
    recipe["memory"] = {"budget_gib": "lots"}
    assert estimate(recipe, 100.0, None).gib == pytest.approx(50.0)


def test_size_unknown_names_the_way_out() -> None:
    recipe = vllm_recipe()
    recipe["kv_cache"] = {"memory_gib_per_rank": 16}
    with pytest.raises(SizeUnknown) as raised:
        estimate(recipe, SPARK_GIB, None)
    text = str(raised.value)
    assert "glm53-nvfp4-dflash2-tp4" in text and "memory.budget_gib" in text and "hub" in text


def test_partly_invalid_recipes_do_not_break_the_estimate() -> None:
    # engine_args not a mapping, parallel sizes as strings, an unknown engine: the validation says what is
    # wrong; the estimate stays defined.
    recipe: dict[str, Any] = {"engine": "vllm", "engine_args": ["--gpu-memory-utilization", "0.5"],
                              "parallel": {"tensor": "4"}, "launch": "x", "memory": None}
    assert estimate(recipe, 100.0, None).gib == pytest.approx(90.0)
    recipe = {"engine": "nope", "parallel": {"tensor": 2}, "kv_cache": {"memory_gib_per_rank": 2}}
    assert estimate(recipe, 100.0, 10 * GIB).gib == pytest.approx(5 + 2 + 4)
    assert estimate({}, 100.0, GIB).gib == pytest.approx(1 + 4)


def test_gpus_per_node_multiplies_the_ranks_of_a_node() -> None:
    recipe = {"engine": "vllm", "parallel": {"tensor": 4, "gpus_per_node": 2}, "kv_cache": {"memory_gib_per_rank": 1}}
    need = estimate(recipe, 200.0, 40 * GIB)
    assert need.gib == pytest.approx(2 * (10 + 1 + 4))
    assert need.basis.endswith("x 2 ranks per node")


def test_weights_bytes_of_sums_every_file() -> None:
    files: list[dict[str, Any]] = [
        {"rfilename": "model-00001-of-00002.safetensors", "size": 5 * GIB, "lfs": {"size": 5 * GIB}},
        {"rfilename": "model-00002-of-00002.safetensors", "lfs": {"size": 3 * GIB}},  # the LFS size only
        {"path": "tokenizer.json", "size": 7_000_000},  # the tree listing's shape
        {"rfilename": "config.json", "size": 1234},
    ]
    assert weights_bytes_of(files) == 8 * GIB + 7_000_000 + 1234
    assert weights_bytes_of([]) == 0
    with pytest.raises(SizeUnknown, match="model.safetensors without its size"):
        weights_bytes_of([{"rfilename": "model.safetensors"}])


def test_budget_gib_is_a_field_of_the_recipe_schema() -> None:
    recipe: dict[str, Any] = {"name": "t", "engine": "vllm", "image": "registry.example:5000/vllm@sha256:" + "3f" * 32,
                              "model": {"repo": "org/model", "revision": COMMIT, "served_name": "m"},
                              "parallel": {"tensor": 2}, "memory": {"budget_gib": 70.5}}
    checked, errors = validate_recipe(recipe, "t")
    assert errors == [] and checked["memory"]["budget_gib"] == 70.5
    recipe["memory"] = {"budget_gib": 0}
    errors = validate_recipe(recipe, "t")[1]
    assert len(errors) == 1 and "memory.budget_gib" in errors[0]


# The hub: a tiny server on 127.0.0.1 that answers model info the way lab/hub/hub_double.py does.

class FakeHub:
    def __init__(self) -> None:
        self.requests: list[tuple[str, str | None]] = []
        self.status = 200
        self.body: Any = {
            "id": "zai-org/GLM-5.3-Flash-NVFP4", "sha": COMMIT,
            "siblings": [
                {"rfilename": "config.json", "size": 2000, "blobId": "a" * 40},
                {"rfilename": "model-00001-of-00002.safetensors", "size": 4 * GIB, "blobId": "b" * 40,
                 "lfs": {"sha256": "c" * 64, "size": 4 * GIB, "pointerSize": 134}},
                {"rfilename": "model-00002-of-00002.safetensors", "size": 2 * GIB, "blobId": "d" * 40,
                 "lfs": {"sha256": "e" * 64, "size": 2 * GIB, "pointerSize": 134}},
            ],
        }


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[FakeHub, str, ThreadingHTTPServer]]:
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    fake = FakeHub()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (the name http.server calls)
            fake.requests.append((self.path, self.headers.get("Authorization")))
            body = json.dumps(fake.body).encode() if not isinstance(fake.body, bytes) else fake.body
            self.send_response(fake.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base class's name)
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield fake, f"http://127.0.0.1:{server.server_address[1]}/", server
    finally:
        server.shutdown()
        server.server_close()


def test_hub_revision_bytes_asks_with_the_token_and_caches_the_commit(
        hub: tuple[FakeHub, str, ThreadingHTTPServer], tmp_path: Path) -> None:
    fake, endpoint, server = hub
    cache = str(tmp_path / "sizes" / "model-sizes.json")
    size = hub_revision_bytes(endpoint, "zai-org/GLM-5.3-Flash-NVFP4", COMMIT, "hf_secret", cache_path=cache)
    assert size == 6 * GIB + 2000
    assert fake.requests == [(f"/api/models/zai-org/GLM-5.3-Flash-NVFP4/revision/{COMMIT}?blobs=true",
                              "Bearer hf_secret")]
    saved = json.loads(Path(cache).read_text(encoding="utf-8"))
    assert saved == {"format": 1, "sizes": {f"zai-org/GLM-5.3-Flash-NVFP4@{COMMIT}": 6 * GIB + 2000}}
    # A second call, with the hub gone: the cache answers, offline.
    server.shutdown()
    server.server_close()
    assert hub_revision_bytes(endpoint, "zai-org/GLM-5.3-Flash-NVFP4", COMMIT, None, cache_path=cache) == size
    assert len(fake.requests) == 1


def test_hub_revision_bytes_without_token_sends_no_authorization(
        hub: tuple[FakeHub, str, ThreadingHTTPServer], tmp_path: Path) -> None:
    fake, endpoint, _ = hub
    hub_revision_bytes(endpoint, "org/model", COMMIT, None, cache_path=str(tmp_path / "c.json"))
    assert fake.requests[0][1] is None


def test_the_cache_keeps_other_entries_and_ignores_a_broken_file(
        hub: tuple[FakeHub, str, ThreadingHTTPServer], tmp_path: Path) -> None:
    fake, endpoint, _ = hub
    cache = tmp_path / "model-sizes.json"
    cache.write_text("{not json", encoding="utf-8")
    assert hub_revision_bytes(endpoint, "org/model", COMMIT, None, cache_path=str(cache)) == 6 * GIB + 2000
    assert len(fake.requests) == 1
    fake.body = {"siblings": [{"rfilename": "draft.safetensors", "size": 100}]}
    assert hub_revision_bytes(endpoint, "org/draft", DRAFT_COMMIT, None, cache_path=str(cache)) == 100
    sizes = json.loads(cache.read_text(encoding="utf-8"))["sizes"]
    assert sizes == {f"org/model@{COMMIT}": 6 * GIB + 2000, f"org/draft@{DRAFT_COMMIT}": 100}


def test_a_branch_is_never_cached(hub: tuple[FakeHub, str, ThreadingHTTPServer], tmp_path: Path) -> None:
    fake, endpoint, _ = hub
    cache = tmp_path / "c.json"
    hub_revision_bytes(endpoint, "org/model", "main", None, cache_path=str(cache))
    hub_revision_bytes(endpoint, "org/model", "main", None, cache_path=str(cache))
    assert len(fake.requests) == 2 and not cache.exists()


def test_hub_errors_name_repo_and_revision_never_the_token(
        hub: tuple[FakeHub, str, ThreadingHTTPServer], tmp_path: Path) -> None:
    fake, endpoint, _ = hub
    cache = str(tmp_path / "c.json")
    fake.status = 401
    fake.body = {"error": "Invalid credentials"}
    with pytest.raises(SizeUnknown) as raised:
        hub_revision_bytes(endpoint, "org/gated", COMMIT, "hf_secret", cache_path=cache)
    text = str(raised.value)
    assert "org/gated" in text and COMMIT in text and "HTTP 401" in text and "token" in text
    assert "hf_secret" not in text
    fake.status = 200
    fake.body = b"<html>"
    with pytest.raises(SizeUnknown, match="not the JSON of a model"):
        hub_revision_bytes(endpoint, "org/model", COMMIT, None, cache_path=cache)
    fake.body = {"siblings": [{"rfilename": "model.safetensors"}]}
    with pytest.raises(SizeUnknown, match="org/model at revision .* without its size"):
        hub_revision_bytes(endpoint, "org/model", COMMIT, None, cache_path=cache)
    assert not Path(cache).exists()


def test_an_unreachable_hub_is_size_unknown(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    server = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    port = server.server_address[1]
    server.server_close()  # nothing listens there now
    with pytest.raises(SizeUnknown) as raised:
        hub_revision_bytes(f"http://127.0.0.1:{port}", "org/model", COMMIT, "hf_secret", timeout_s=2,
                           cache_path=str(tmp_path / "c.json"))
    text = str(raised.value)
    assert text.startswith(f"the size of org/model at revision {COMMIT} is unknown: the hub could not be reached")
    assert "hf_secret" not in text and "\n" not in text


def test_default_cache_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_cache_path() == str(tmp_path / "sparkserve" / "model-sizes.json")
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_cache_path() == str(tmp_path / "home" / ".cache" / "sparkserve" / "model-sizes.json")
