"""Tests for weights_progress: bytes arrived against the revision's size, and the async job's state."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from ansible.module_utils.testing import patch_module_args

from ansible_collections.sparkserve.deploy.plugins.module_utils import weights as w
from ansible_collections.sparkserve.deploy.plugins.modules import weights_progress as wp

pytestmark = pytest.mark.usefixtures("as_module")

REVISION = "00112233445566778899aabbccddeeff00112233"


def write_manifest(root: Path, contents: dict[str, bytes]) -> None:
    files = {p: {"size": len(d), "sha256": hashlib.sha256(d).hexdigest(), "source": "computed"}
             for p, d in contents.items()}
    (root / w.MANIFEST_NAME).write_text(json.dumps({"format": 1, "repo": "org/name", "revision": REVISION,
                                                    "files": files}))


def run_main(args: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    with patch_module_args(args), pytest.raises(SystemExit):
        wp.main()
    return json.loads(capsys.readouterr().out)


def test_a_fetch_counts_whole_and_partial_files_against_the_manifest(tmp_path: Path) -> None:
    write_manifest(tmp_path, {"a.safetensors": b"x" * 1000, "b.safetensors": b"y" * 3000})
    (tmp_path / "a.safetensors").write_bytes(b"x" * 1000)
    (tmp_path / w.PARTIAL_DIR).mkdir()
    (tmp_path / w.PARTIAL_DIR / "b.safetensors").write_bytes(b"y" * 500)
    (tmp_path / w.CACHE_NAME).write_text("{}")
    assert wp.progress(str(tmp_path), "fanout", "org/name") == {
        "kind": "fanout", "label": "org/name", "done": 1500, "total": 4000, "unit": "bytes"}


def test_a_download_reads_the_size_the_program_wrote_and_counts_the_hub_clients_unfinished_files(
        tmp_path: Path) -> None:
    (tmp_path / w.DOWNLOAD_NAME).write_text(json.dumps({"bytes": 10_000}))
    unfinished = tmp_path / ".cache/huggingface/download"
    unfinished.mkdir(parents=True)
    (unfinished / "model.safetensors.abc.incomplete").write_bytes(b"z" * 2500)
    (unfinished / "model.safetensors.metadata").write_text("etag")
    (unfinished / "model.safetensors.lock").write_text("")
    assert wp.progress(str(tmp_path), "download", "org/name")["done"] == 2500
    assert wp.progress(str(tmp_path), "download", "org/name")["total"] == 10_000


def test_an_unknown_size_is_zero_and_a_missing_folder_has_nothing(tmp_path: Path) -> None:
    assert wp.progress(str(tmp_path / "not-yet"), "download", "org/name") == {
        "kind": "download", "label": "org/name", "done": 0, "total": 0, "unit": "bytes"}
    (tmp_path / w.DOWNLOAD_NAME).write_text("not json")
    assert w.expected_bytes(str(tmp_path)) is None


def args_for(tmp_path: Path, **changes: Any) -> dict[str, Any]:
    args = {"job_id": "123.456", "async_dir": str(tmp_path), "path": str(tmp_path / "m"), "kind": "fanout",
            "label": "org/name", "wait_s": 0}
    args.update(changes)
    return args


def test_the_job_is_finished_once_its_file_holds_the_result(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    job = tmp_path / "123.456"
    job.write_text(json.dumps({"started": 1, "finished": 0, "ansible_job_id": "123.456"}))
    assert run_main(args_for(tmp_path), capsys)["finished"] is False
    job.write_text("")
    assert run_main(args_for(tmp_path), capsys)["finished"] is False, "a file being written counts as running"
    job.write_text(json.dumps({"changed": True, "fetched": ["a"], "invocation": {"module_args": {}}}))
    result = run_main(args_for(tmp_path), capsys)
    assert result["finished"] is True and result["changed"] is True
    assert result["job"] == {"changed": True, "fetched": ["a"]}
    assert result["sparkserve_progress"]["kind"] == "fanout"


def test_a_failed_job_fails_with_its_message_unless_told_not_to(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "123.456").write_text(json.dumps({
        "failed": True, "msg": "rsync refused", "container": {"Output": "log", "Config": {"Env": ["HF_TOKEN=x"]}}}))
    failed = run_main(args_for(tmp_path), capsys)
    assert failed["failed"] is True and failed["msg"] == "rsync refused" and failed["finished"] is True
    told = run_main(args_for(tmp_path, job_keys=["failed", "msg", "container.Output"], fail_on_job_failure=False),
                    capsys)
    assert not told.get("failed") and told["job"] == {"failed": True, "msg": "rsync refused",
                                                      "container.Output": "log"}
    assert "HF_TOKEN" not in json.dumps(told), "only the keys named come back"


def test_a_call_waits_for_the_job_to_end_within_its_wait(tmp_path: Path) -> None:
    job = tmp_path / "1.2"
    job.write_text(json.dumps({"started": 1, "finished": 0}))
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds
        if now[0] >= 0.5:
            job.write_text(json.dumps({"changed": False}))

    assert wp.wait_for_job(str(tmp_path), "1.2", 1.0, clock=lambda: now[0], sleep=sleep) == {"changed": False}
    assert 0.5 <= now[0] < 1.0, "it returned as soon as the job ended"
    job.write_text(json.dumps({"started": 1, "finished": 0}))
    now[0] = -10.0  # far from the 0.5 at which sleep() ends the job above: it runs the whole wait

    def wait(seconds: float) -> None:
        now[0] += seconds

    assert wp.wait_for_job(str(tmp_path), "1.2", 1.0, clock=lambda: now[0], sleep=wait) is None
    assert now[0] >= -9.0


def test_a_job_that_does_not_exist_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    result = run_main(args_for(tmp_path, job_id="9.9"), capsys)
    assert result["failed"] is True and "no async job 9.9" in result["msg"] and result["finished"] is True
