"""Real weight loading: find the safetensors shards, check them, read every byte.

A safetensors file is an 8-byte little-endian header length N, N bytes of a
JSON header (tensor name -> dtype, shape, data_offsets; optional
``__metadata__``), then the tensor bytes. The offsets are relative to the end
of the header and must tile the data exactly, so a truncated or padded file is
caught before a byte of data is read. If ``model.safetensors.index.json`` is
present, every shard it names must exist and hold the tensors it maps there.

Reads are paced to a configurable rate (MiB/s) with sleeps, the way a slow
disk or a page cache under pressure paces a real load.
"""

from __future__ import annotations

import json
import math
import struct
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

MIB = 1024 * 1024
INDEX_NAME = "model.safetensors.index.json"
MAX_HEADER_BYTES = 100 * 1000 * 1000  # the safetensors format's own limit
READ_CHUNK = MIB

# Bits per element of each safetensors dtype.
DTYPE_BITS: dict[str, int] = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E4M3": 8, "F8_E5M2": 8, "F8_E8M0": 8,
    "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
    "I32": 32, "U32": 32, "F32": 32, "I64": 64, "U64": 64, "F64": 64,
    "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
}


class WeightError(Exception):
    """The model folder or one of its shards cannot be loaded."""


class LoadInterrupted(Exception):  # noqa: N818 (a request to stop, like KeyboardInterrupt; not an error)
    """The engine was asked to stop while it was reading weights."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


@dataclass(frozen=True)
class ShardHeader:
    """A shard's parsed header; data starts at ``8 + header_len``."""

    path: Path
    header_len: int
    file_size: int
    tensors: tuple[TensorInfo, ...]
    metadata: dict[str, str]

    @property
    def data_size(self) -> int:
        return self.file_size - 8 - self.header_len


@dataclass(frozen=True)
class LoadReport:
    shards: int
    bytes_read: int
    seconds: float


def _tensor(path: Path, name: str, entry: Any) -> TensorInfo:
    if not isinstance(entry, dict):
        raise WeightError("%s: tensor %r is not a JSON object in the header" % (path.name, name))
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if dtype not in DTYPE_BITS:
        raise WeightError("%s: tensor %r has unknown dtype %r" % (path.name, name, dtype))
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                              for d in shape):
        raise WeightError("%s: tensor %r has a bad shape %r" % (path.name, name, shape))
    if (not isinstance(offsets, list) or len(offsets) != 2
            or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)):
        raise WeightError("%s: tensor %r has bad data_offsets %r" % (path.name, name, offsets))
    begin, end = offsets
    bits = math.prod(shape) * DTYPE_BITS[dtype]
    if bits % 8 or end - begin != bits // 8 or begin < 0:
        raise WeightError("%s: tensor %r: data_offsets %r do not hold %s %s (%d bytes)"
                          % (path.name, name, offsets, dtype, shape, bits // 8))
    return TensorInfo(name, dtype, tuple(shape), begin, end)


def _check_tiling(path: Path, tensors: list[TensorInfo], data_size: int) -> None:
    """The tensors' byte ranges must follow each other from 0 to the end of the file."""
    position = 0
    for info in sorted(tensors, key=lambda t: (t.begin, t.end)):
        if info.begin != position:
            raise WeightError("%s: tensor %r starts at data offset %d, expected %d (overlap or gap)"
                              % (path.name, info.name, info.begin, position))
        position = info.end
    if position != data_size:
        raise WeightError("%s: data_offsets end at %d but the file holds %d data bytes "
                          "(truncated or corrupt file)" % (path.name, position, data_size))


def _header_json(path: Path, raw: bytes) -> dict[str, Any]:
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise WeightError("%s: corrupt header, not valid JSON (%s)" % (path.name, exc)) from None
    if not isinstance(header, dict):
        raise WeightError("%s: corrupt header, not a JSON object" % path.name)
    return header


def read_header(path: Path) -> ShardHeader:
    """Parse and check one shard's header; raises WeightError naming the file."""
    try:
        file_size = path.stat().st_size
        with path.open("rb") as handle:
            prefix = handle.read(8)
            if len(prefix) < 8:
                raise WeightError("%s: %d bytes, too short for a safetensors header" % (path.name, file_size))
            (header_len,) = struct.unpack("<Q", prefix)
            if header_len == 0 or header_len > MAX_HEADER_BYTES or header_len > file_size - 8:
                raise WeightError("%s: corrupt header length %d for a file of %d bytes"
                                  % (path.name, header_len, file_size))
            raw = handle.read(header_len)
    except OSError as exc:
        raise WeightError("%s: cannot read (%s)" % (path.name, exc.strerror or exc)) from None
    header = _header_json(path, raw)
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict):
        raise WeightError("%s: __metadata__ is not a JSON object" % path.name)
    tensors = [_tensor(path, name, entry) for name, entry in header.items()]
    shard = ShardHeader(path, header_len, file_size, tuple(tensors), {str(k): str(v) for k, v in metadata.items()})
    _check_tiling(path, tensors, shard.data_size)
    return shard


def find_shards(model_dir: Path) -> list[Path]:
    """Every ``*.safetensors`` file of the folder, in name order."""
    if not model_dir.is_dir():
        raise WeightError("model folder %s does not exist or is not a folder" % model_dir)
    shards = sorted(p for p in model_dir.glob("*.safetensors") if p.is_file())
    if not shards:
        raise WeightError("no *.safetensors file in %s" % model_dir)
    return shards


def read_index(model_dir: Path) -> dict[str, str] | None:
    """The index's weight_map (tensor -> shard file), or None without an index."""
    path = model_dir / INDEX_NAME
    if not path.exists():
        return None
    try:
        index = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise WeightError("%s: cannot read the index (%s)" % (INDEX_NAME, exc)) from None
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise WeightError("%s: no weight_map of tensor names to shard files" % INDEX_NAME)
    return {str(k): v for k, v in weight_map.items()}


def check_index(model_dir: Path, weight_map: dict[str, str], headers: dict[str, ShardHeader]) -> None:
    """Every shard the index names exists, and holds the tensors mapped to it."""
    for shard_name in sorted(set(weight_map.values())):
        if not (model_dir / shard_name).is_file():
            raise WeightError("missing shard %s: named in %s but not in %s" % (shard_name, INDEX_NAME, model_dir))
    for tensor, shard_name in sorted(weight_map.items()):
        header = headers.get(shard_name)
        if header is not None and tensor not in {t.name for t in header.tensors}:
            raise WeightError("%s maps tensor %r to %s, which does not hold it" % (INDEX_NAME, tensor, shard_name))


def _pace(started: float, done: int, bytes_per_s: float, stop: threading.Event | None) -> None:
    """Sleep until ``done`` bytes are due at the given rate."""
    due = started + done / bytes_per_s
    delay = due - time.monotonic()
    if delay <= 0:
        return
    if stop is None:
        time.sleep(delay)
    elif stop.wait(delay):
        raise LoadInterrupted()


def read_shard(header: ShardHeader, mib_per_s: float, stop: threading.Event | None = None) -> int:
    """Read every byte of the shard at most at ``mib_per_s`` (0: no limit); return the count."""
    rate = mib_per_s * MIB
    chunk = READ_CHUNK if rate <= 0 else max(4096, min(READ_CHUNK, int(rate / 20)))
    started = time.monotonic()
    done = 0
    try:
        with header.path.open("rb") as handle:
            while True:
                if stop is not None and stop.is_set():
                    raise LoadInterrupted()
                block = handle.read(chunk)
                if not block:
                    break
                done += len(block)
                if rate > 0:
                    _pace(started, done, rate, stop)
    except OSError as exc:
        raise WeightError("%s: read failed (%s)" % (header.path.name, exc.strerror or exc)) from None
    if done != header.file_size:
        raise WeightError("%s: read %d bytes, expected %d (file changed while loading)"
                          % (header.path.name, done, header.file_size))
    return done


def load_model(model_dir: Path, mib_per_s: float, log: Callable[[str], None],
               stop: threading.Event | None = None) -> LoadReport:
    """Check the folder's shards and index, then read all their bytes, logging each shard."""
    started = time.monotonic()
    shards = find_shards(model_dir)
    weight_map = read_index(model_dir)
    if weight_map is not None:
        check_index(model_dir, weight_map, {})
    headers = {path.name: read_header(path) for path in shards}
    if weight_map is not None:
        check_index(model_dir, weight_map, headers)
    total = 0
    for number, header in enumerate(headers.values(), start=1):
        shard_started = time.monotonic()
        count = read_shard(header, mib_per_s, stop)
        total += count
        seconds = time.monotonic() - shard_started
        # The progress line of vLLM's (and SGLang's) safetensors loader, which sparkserve reads as the load bar.
        log("Loading safetensors checkpoint shards: %3d%% Completed | %d/%d [%s: %d tensors, %.1f MiB in %.2f s]"
            % (100 * number // len(headers), number, len(headers), header.path.name, len(header.tensors),
               count / MIB, seconds))
    return LoadReport(len(headers), total, time.monotonic() - started)
