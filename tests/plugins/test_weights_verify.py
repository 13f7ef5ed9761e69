"""Tests for weights_verify: the module's verdict, removal of corrupt files, check and diff mode."""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
from ansible.module_utils.testing import patch_module_args

from ansible_collections.sparkserve.deploy.plugins.module_utils import weights as w
from ansible_collections.sparkserve.deploy.plugins.modules import weights_verify as wv

# Each test may run a module's main(): as on a node (see tests/conftest.py).
pytestmark = pytest.mark.usefixtures("as_module")

REVISION = "fedcba9876543210fedcba9876543210fedcba98"
HOUR_AGO_NS = time.time_ns() - 3600 * 10**9
CONTENTS = {
    "config.json": b'{"hidden_size": 64}',
    "model-00001-of-00002.safetensors": os.urandom(1_000_003),
    "model-00002-of-00002.safetensors": os.urandom(200_000),
}


def make_revision(root: Path, contents: dict[str, bytes]) -> dict[str, Any]:
    files = {}
    for relpath, data in contents.items():
        (root / relpath).parent.mkdir(parents=True, exist_ok=True)
        (root / relpath).write_bytes(data)
        os.utime(root / relpath, ns=(HOUR_AGO_NS, HOUR_AGO_NS))
        files[relpath] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest(), "source": "computed"}
    manifest = {"format": 1, "repo": "org/name", "revision": REVISION, "files": files}
    (root / w.MANIFEST_NAME).write_text(json.dumps(manifest), encoding="utf-8")
    return manifest


def run_main(args: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    with patch_module_args(args), pytest.raises(SystemExit):
        wv.main()
    return json.loads(capsys.readouterr().out)


def spoil(root: Path) -> None:
    """Flip a byte of shard 1 (same size) and cut shard 2 short."""
    shard = root / "model-00001-of-00002.safetensors"
    data = bytearray(shard.read_bytes())
    data[10] ^= 1
    shard.write_bytes(bytes(data))
    (root / "model-00002-of-00002.safetensors").write_bytes(b"short")


def test_an_intact_folder_passes_and_the_second_run_uses_the_cache(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    make_revision(tmp_path, CONTENTS)
    first = run_main({"path": str(tmp_path), "workers": 2}, capsys)
    assert "failed" not in first
    assert first["changed"] is False
    assert first["ok_count"] == 3
    assert (first["missing"], first["corrupt"], first["unexpected"], first["removed"]) == ([], [], [], [])
    assert first["hashed_bytes"] == first["bytes_total"] == sum(len(d) for d in CONTENTS.values())
    second = run_main({"path": str(tmp_path)}, capsys)
    assert (second["hashed_bytes"], second["cached"], second["changed"]) == (0, 3, False)


def test_fails_naming_missing_and_corrupt_with_hashes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    make_revision(tmp_path, CONTENTS)
    spoil(tmp_path)
    (tmp_path / "config.json").unlink()
    out = run_main({"path": str(tmp_path)}, capsys)
    assert out["failed"] is True and out["changed"] is False
    actual = hashlib.sha256((tmp_path / "model-00001-of-00002.safetensors").read_bytes()).hexdigest()
    expected = hashlib.sha256(CONTENTS["model-00001-of-00002.safetensors"]).hexdigest()
    assert out["msg"] == (
        f"{tmp_path} does not match its manifest: 1 missing: config.json; 2 corrupt: "
        f"model-00001-of-00002.safetensors (sha256 {actual}, expected {expected}), "
        "model-00002-of-00002.safetensors (size 5, expected 200000)")
    assert out["missing"] == ["config.json"] and [c["path"] for c in out["corrupt"]] == [
        "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    assert out["removed"] == [] and (tmp_path / "model-00002-of-00002.safetensors").exists()


def test_the_message_shows_the_first_few(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    make_revision(tmp_path, {f"f{n}.bin": b"%d" % n for n in range(8)})
    for n in range(8):
        (tmp_path / f"f{n}.bin").unlink()
    out = run_main({"path": str(tmp_path)}, capsys)
    assert out["msg"].endswith("8 missing: f0.bin, f1.bin, f2.bin, f3.bin, f4.bin and 3 more")


def test_fail_on_picks_the_classes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    make_revision(tmp_path, CONTENTS)
    (tmp_path / "stray.txt").write_bytes(b"x")
    (tmp_path / ".cache" / "huggingface").mkdir(parents=True)
    (tmp_path / ".cache" / "huggingface" / "x.lock").write_bytes(b"")
    passed = run_main({"path": str(tmp_path)}, capsys)
    assert "failed" not in passed and passed["unexpected"] == ["stray.txt"]
    failed = run_main({"path": str(tmp_path), "fail_on": ["unexpected"]}, capsys)
    assert failed["failed"] is True and failed["msg"].endswith("1 unexpected: stray.txt")
    (tmp_path / "config.json").unlink()
    assert "failed" not in run_main({"path": str(tmp_path), "fail_on": []}, capsys)


def test_remove_corrupt_removes_them_and_reports_a_diff(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    make_revision(tmp_path, CONTENTS)
    spoil(tmp_path)
    out = run_main({"path": str(tmp_path), "remove_corrupt": True, "fail_on": [], "_ansible_diff": True}, capsys)
    assert out["changed"] is True
    assert out["removed"] == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    assert sorted(p.name for p in tmp_path.iterdir() if not w.is_bookkeeping(p.name)) == ["config.json"]
    assert out["diff"]["before"] == "config.json\nmodel-00001-of-00002.safetensors\nmodel-00002-of-00002.safetensors\n"
    assert out["diff"]["after"] == "config.json\n"
    again = run_main({"path": str(tmp_path), "remove_corrupt": True, "fail_on": []}, capsys)
    assert again["changed"] is False and again["missing"] == out["removed"] and again["corrupt"] == []


def test_remove_corrupt_in_check_mode_removes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    make_revision(tmp_path, CONTENTS)
    spoil(tmp_path)
    out = run_main({"path": str(tmp_path), "remove_corrupt": True, "_ansible_check_mode": True}, capsys)
    assert out["changed"] is True and out["failed"] is True  # corrupt files fail by default
    assert out["removed"] == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    assert (tmp_path / "model-00001-of-00002.safetensors").exists()
    assert (tmp_path / "model-00002-of-00002.safetensors").read_bytes() == b"short"
    assert not (tmp_path / w.CACHE_NAME).exists()  # check mode writes no cache either


def test_a_manifest_elsewhere_and_a_bad_manifest(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    make_revision(tmp_path / "rev", CONTENTS)
    (tmp_path / "rev" / w.MANIFEST_NAME).rename(tmp_path / "m.json")
    out = run_main({"path": str(tmp_path / "rev"), "manifest": str(tmp_path / "m.json")}, capsys)
    assert out["ok_count"] == 3
    missing = run_main({"path": str(tmp_path / "rev")}, capsys)
    assert missing["failed"] is True
    assert missing["msg"] == f"manifest {tmp_path / 'rev' / w.MANIFEST_NAME} does not exist"
    (tmp_path / "m.json").write_text('{"format": 1}', encoding="utf-8")
    bad = run_main({"path": str(tmp_path / "rev"), "manifest": str(tmp_path / "m.json")}, capsys)
    assert "repo None is not of the form org/name" in bad["msg"]


def test_option_checks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    make_revision(tmp_path, CONTENTS)
    assert "workers -1" in run_main({"path": str(tmp_path), "workers": -1}, capsys)["msg"]
    assert run_main({"path": str(tmp_path), "fail_on": ["nonsense"]}, capsys)["failed"] is True
