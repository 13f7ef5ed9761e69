#!/usr/bin/python3
"""Write a tiny model folder for the sparkserve lab: real safetensors, nothing to run.

The lab's engine double (vllm_double) loads it the way vLLM loads a Hugging
Face checkpoint; no real engine could generate anything useful from it. The
output depends only on the arguments, byte for byte, so two runs give the same
files (and the same git tree when the folder is committed as a model repo).

Usage::

    make_tiny_model.py OUT [--shards 4] [--shard-mib 8] [--seed 0]

OUT gets ``config.json``, ``generation_config.json``, ``tokenizer.json``,
``tokenizer_config.json``, ``model-0000i-of-0000N.safetensors`` (each: 8-byte
little-endian header length, JSON header with dtype, shape and data_offsets,
then the tensor bytes, pseudo-random from SHAKE-256 of the seed) and
``model.safetensors.index.json`` mapping every tensor to its shard.
Standard library only.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import struct
import sys
from pathlib import Path
from typing import Any, Sequence

MIB = 1024 * 1024
HIDDEN = 512
BYTES_PER_ROW = HIDDEN * 2  # one BF16 row
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj")
MAX_POSITIONS = 4096
VOCAB_WORDS = (
    "the engine spark node token cache model weights serves answers a of and to in is on with for from "
    "fast small steady lab double request stream memory fabric rank head worker joins loads reads shard "
    "tensor block layer draft accepts decodes prompt reply text word line step time rate Paris capital "
    "France city river north south east west light quiet clear simple done The capital of France is"
).split()
SPECIAL = ("<unk>", "<s>", "</s>")


def shard_name(index: int, count: int) -> str:
    return "model-%05d-of-%05d.safetensors" % (index + 1, count)


def tensor_plan(shard_bytes: int, layer: int) -> list[tuple[str, list[int], int]]:
    """(name, shape, bytes) of one shard's tensors: one layer's four attention projections."""
    rows_total = shard_bytes // BYTES_PER_ROW
    rows = [rows_total // 4 + (1 if i < rows_total % 4 else 0) for i in range(4)]
    return [("model.layers.%d.self_attn.%s.weight" % (layer, proj), [n, HIDDEN], n * BYTES_PER_ROW)
            for proj, n in zip(PROJECTIONS, rows, strict=True)]


def shard_bytes_of(shard_mib: float) -> int:
    """Shard data size: shard_mib MiB, rounded down to whole BF16 rows, at least 4 rows."""
    rows = int(shard_mib * MIB) // BYTES_PER_ROW
    return max(rows, 4) * BYTES_PER_ROW


def encode_shard(tensors: list[tuple[str, list[int], int]], data: bytes) -> bytes:
    """A safetensors file: header length, JSON header padded with spaces to 8 bytes, data."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, shape, size in tensors:
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header, separators=(",", ":"), sort_keys=True).encode("utf-8")
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw + data


def shard_data(seed: int, index: int, size: int) -> bytes:
    return hashlib.shake_256(b"sparkserve-lab-tiny-model:%d:%d" % (seed, index)).digest(size)


def tokenizer_json() -> dict[str, Any]:
    """A WordLevel tokenizer splitting on whitespace: one token per word, as the double counts."""
    vocab: dict[str, int] = {}
    for word in SPECIAL + tuple(VOCAB_WORDS):
        vocab.setdefault(word, len(vocab))
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": vocab[t], "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True} for t in SPECIAL],
        "normalizer": None, "pre_tokenizer": {"type": "WhitespaceSplit"}, "post_processor": None,
        "decoder": None, "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"},
    }


def config_json(layers: int, vocab_size: int) -> dict[str, Any]:
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": HIDDEN,
        "intermediate_size": 2 * HIDDEN, "num_hidden_layers": layers, "num_attention_heads": 8,
        "num_key_value_heads": 8, "vocab_size": vocab_size, "max_position_embeddings": MAX_POSITIONS,
        "rms_norm_eps": 1e-5, "torch_dtype": "bfloat16", "bos_token_id": 1, "eos_token_id": 2,
        "tie_word_embeddings": False, "sparkserve_lab": "tiny model for the vLLM lab double; not a real model",
    }


def write_json(path: Path, value: Any) -> None:
    path.write_text(json.dumps(value, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def make_model(out: Path, shards: int, shard_mib: float, seed: int = 0) -> list[Path]:
    """Write the folder; return the shard paths."""
    out.mkdir(parents=True, exist_ok=True)
    size = shard_bytes_of(shard_mib)
    weight_map: dict[str, str] = {}
    paths = []
    for index in range(shards):
        tensors = tensor_plan(size, index)
        path = out / shard_name(index, shards)
        path.write_bytes(encode_shard(tensors, shard_data(seed, index, size)))
        weight_map.update({name: path.name for name, _, _ in tensors})
        paths.append(path)
    write_json(out / "model.safetensors.index.json",
               {"metadata": {"total_size": size * shards}, "weight_map": weight_map})
    tokenizer = tokenizer_json()
    write_json(out / "tokenizer.json", tokenizer)
    write_json(out / "config.json", config_json(shards, len(tokenizer["model"]["vocab"])))
    write_json(out / "tokenizer_config.json", {
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
        "unk_token": "<unk>", "model_max_length": MAX_POSITIONS, "clean_up_tokenization_spaces": False})
    write_json(out / "generation_config.json", {
        "bos_token_id": 1, "eos_token_id": [2], "do_sample": True, "temperature": 0.7, "top_p": 0.9})
    return paths


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write a tiny safetensors model folder for the sparkserve lab.")
    parser.add_argument("out", type=Path, help="folder to write (created if missing)")
    parser.add_argument("--shards", type=int, default=4, help="number of safetensors shards (default 4)")
    parser.add_argument("--shard-mib", type=float, default=8.0, help="data size of each shard in MiB (default 8)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the tensor bytes (default 0)")
    args = parser.parse_args(argv)
    if args.shards < 1 or args.shards > 99999 or args.shard_mib <= 0:
        parser.error("--shards must be from 1 to 99999 and --shard-mib above 0")
    paths = make_model(args.out, args.shards, args.shard_mib, args.seed)
    total = sum(p.stat().st_size for p in paths)
    print(json.dumps({"out": str(args.out), "shards": len(paths), "bytes": total}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
