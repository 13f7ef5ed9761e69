"""Tests for image_overlay and its zero-fuzz diff applier: real patches, real hashes, a docker double."""

from __future__ import annotations

import difflib
import hashlib
import io
import json
import os
import tarfile
from pathlib import Path
from typing import Any, Sequence

import pytest
from ansible.module_utils.testing import patch_module_args

from ansible_collections.sparkserve.deploy.plugins.module_utils import unified_diff as ud
from ansible_collections.sparkserve.deploy.plugins.modules import image_overlay as io_mod

# Each test may run a module's main(): as on a node (see tests/conftest.py).
pytestmark = pytest.mark.usefixtures("as_module")

IMAGE = "registry.example/vllm/vllm-openai@sha256:" + "ab" * 32
MODEL_PY = "/usr/lib/python3/dist-packages/vllm/model.py"
SAMPLER_PY = "/usr/lib/python3/dist-packages/vllm/sampler.py"

MODEL = "".join(f"line {n}\n" for n in range(1, 41))
MODEL_PATCHED = MODEL.replace("line 3\n", "line 3 patched\n").replace("line 30\n", "line 30\nline 30b\n")
SAMPLER = "import os\n\n\ndef sample(x):\n    return x\n"
SAMPLER_PATCHED = "import os\n\n\ndef sample(x):\n    return x * 2\n"


def make_patch(old: str, new: str, name: str = "x.py", n: int = 3) -> str:
    return "".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True), f"a/{name}", f"b/{name}", n=n))


def sha(text: str | bytes) -> str:
    return hashlib.sha256(text.encode() if isinstance(text, str) else text).hexdigest()


# --- the diff applier --------------------------------------------------------------------------------------


def test_clean_apply_with_several_hunks_and_git_preamble() -> None:
    patch = "diff --git a/x.py b/x.py\nindex 1111111..2222222 100644\n" + make_patch(MODEL, MODEL_PATCHED)
    parsed = ud.parse_patch(patch)
    assert [h.number for h in parsed.hunks] == [1, 2] and parsed.target == "x.py"
    assert ud.apply_patch(MODEL, patch) == MODEL_PATCHED
    assert ud.apply_patch(MODEL.encode(), patch.encode()) == MODEL_PATCHED.encode()


def test_line_endings_are_kept_exactly() -> None:
    old = "a\r\nb\r\nc\r\n"
    new = "a\r\nB\r\nc\r\n"
    patch = make_patch(old, new)
    assert ud.apply_patch(old.encode(), patch) == new.encode()
    with pytest.raises(ud.PatchError) as err:  # the same lines with bare \n do not match
        ud.apply_patch("a\nb\nc\n", patch)
    assert err.value.hunk == 1 and err.value.line == 1


def test_no_newline_at_end_of_file() -> None:
    old = "one\ntwo\nthree"
    new = "one\ntwo\nTHREE"
    patch = ("--- a/x.py\t2026-01-01 00:00:00\n+++ b/x.py\t2026-01-01 00:00:01\n@@ -1,3 +1,3 @@\n one\n two\n"
             "-three\n\\ No newline at end of file\n+THREE\n\\ No newline at end of file\n")
    assert ud.apply_patch(old, patch) == new
    adding = "--- a/x.py\n+++ b/x.py\n@@ -2,2 +2,2 @@\n two\n-three\n\\ No newline at end of file\n+three\n"
    assert ud.apply_patch(old, adding) == "one\ntwo\nthree\n"
    with pytest.raises(ud.PatchError, match="hunk 1"):  # the marker says "three" has no newline; here it has one
        ud.apply_patch(old + "\n", patch)


def test_context_mismatch_names_hunk_line_and_both_lines() -> None:
    patch = make_patch(MODEL, MODEL_PATCHED)
    changed = MODEL.replace("line 31\n", "line 31 (upstream)\n")
    with pytest.raises(ud.PatchError) as err:
        ud.apply_patch(changed, patch)
    assert err.value.hunk == 2 and err.value.line == 31
    assert err.value.expected == b"line 31\n" and err.value.found == b"line 31 (upstream)\n"
    assert "hunk 2 (@@ -28,6 +28,7 @@): line 31: expected 'line 31\\n', found 'line 31 (upstream)\\n'" in str(err.value)


def test_no_offset_is_allowed() -> None:
    patch = make_patch(MODEL, MODEL_PATCHED)
    shifted = "new first line\n" + MODEL  # GNU patch would apply this with offset 1
    with pytest.raises(ud.PatchError) as err:
        ud.apply_patch(shifted, patch)
    assert err.value.hunk == 1 and err.value.line == 1
    assert "at line 2 (offset +1), but hunks apply at zero offset only" in str(err.value)


def test_no_fuzz_even_in_outer_context() -> None:
    patch = make_patch(MODEL, MODEL_PATCHED)
    with pytest.raises(ud.PatchError, match=r"hunk 1 .*line 6: expected 'line 6\\n', found 'line six\\n'"):
        ud.apply_patch(MODEL.replace("line 6\n", "line six\n"), patch)


def test_unreadable_patches_are_refused() -> None:
    with pytest.raises(ud.PatchError, match="no unified diff"):
        ud.parse_patch("just text\n")
    cut = make_patch(SAMPLER, SAMPLER_PATCHED).rsplit("\n", 2)[0] + "\n"
    with pytest.raises(ud.PatchError, match="hunk 1 .*cut short"):
        ud.parse_patch(cut)
    two = make_patch(SAMPLER, SAMPLER_PATCHED, "s.py") + make_patch(MODEL, MODEL_PATCHED, "m.py")
    with pytest.raises(ud.PatchError, match="touches 2 files"):
        ud.parse_patch(two)


def test_split_patch_keys_by_target_path() -> None:
    sql_old, sql_new = "-- a comment\nselect 1;\n", "select 1;\n"  # removing "-- ..." reads "--- ..."
    multi = ("diff --git a/vllm/s.py b/vllm/s.py\nindex 1..2 100644\n"
             + make_patch(SAMPLER, SAMPLER_PATCHED, "vllm/s.py")
             + make_patch(sql_old, sql_new, "q.sql") + make_patch(MODEL, MODEL_PATCHED, "vllm/m.py"))
    parts = ud.split_patch(multi)
    assert list(parts) == ["vllm/s.py", "q.sql", "vllm/m.py"]
    assert parts["vllm/s.py"].startswith("diff --git")
    assert ud.apply_patch(SAMPLER, parts["vllm/s.py"]) == SAMPLER_PATCHED
    assert ud.apply_patch(sql_old, parts["q.sql"]) == sql_new
    assert ud.apply_patch(MODEL, parts["vllm/m.py"]) == MODEL_PATCHED


# --- the module ----------------------------------------------------------------------------------------------


class FakeDocker:
    """Stands in for the docker client: create, cp (a tar stream of the originals) and rm, recording every argv."""

    CONFLICT = "Error response from daemon: Conflict. The container name is already in use\n"

    def __init__(self, originals: dict[str, bytes], create_rc: int = 0, create_err: str = CONFLICT) -> None:
        self.originals = originals
        self.create_rc = create_rc
        self.create_err = create_err
        self.calls: list[list[str]] = []

    def __call__(self, argv: Sequence[str]) -> tuple[int, bytes, str]:
        argv = list(argv)
        self.calls.append(argv)
        if argv[1] == "create":
            if self.create_rc:
                return self.create_rc, b"", self.create_err
            return 0, b"c0ffee\n", ""
        if argv[1] == "cp":
            cid, path = argv[2].split(":", 1)
            assert cid == "c0ffee" and argv[3] == "-"
            if path not in self.originals:
                return 1, b"", f"Error response from daemon: Could not find the file {path} in container {cid}\n"
            buffer = io.BytesIO()
            with tarfile.open(fileobj=buffer, mode="w") as tar:
                info = tarfile.TarInfo(os.path.basename(path))
                info.size = len(self.originals[path])
                tar.addfile(info, io.BytesIO(self.originals[path]))
            return 0, buffer.getvalue(), ""
        if argv[1:3] == ["rm", "-f"]:
            return 0, b"", ""
        raise AssertionError(f"unexpected docker call {argv}")

    def check_safe(self) -> None:
        assert self.calls[0] == ["docker", "create", "--pull", "never", "--network", "none", "--entrypoint",
                                 "/bin/true", IMAGE]
        assert not any("start" in argv or "run" in argv or "exec" in argv for argv in self.calls)
        assert self.calls[-1] == ["docker", "rm", "-f", "c0ffee"]


def recipe_files(**overrides: Any) -> list[dict[str, str]]:
    files = [
        {"path": MODEL_PY, "original_sha256": sha(MODEL), "patch": make_patch(MODEL, MODEL_PATCHED, "vllm/model.py"),
         "result_sha256": sha(MODEL_PATCHED)},
        {"path": SAMPLER_PY, "original_sha256": sha(SAMPLER),
         "patch": make_patch(SAMPLER, SAMPLER_PATCHED, "vllm/sampler.py"), "result_sha256": sha(SAMPLER_PATCHED)},
    ]
    for key, value in overrides.items():
        files[0][key] = value
    return files


def originals() -> dict[str, bytes]:
    return {MODEL_PY: MODEL.encode(), SAMPLER_PY: SAMPLER.encode()}


def tree(root: Path) -> dict[str, bytes]:
    if not root.exists():
        return {}
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def run_main(args: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    with patch_module_args(args), pytest.raises(SystemExit):
        io_mod.main()
    return json.loads(capsys.readouterr().out)


def test_writes_verified_results_and_mounts(tmp_path: Path) -> None:
    dest = tmp_path / "overlays" / "lab"
    docker = FakeDocker(originals())
    outcome = io_mod.converge(IMAGE, str(dest), recipe_files(), runner=docker)
    docker.check_safe()
    assert [argv[2] for argv in docker.calls if argv[1] == "cp"] == [f"c0ffee:{MODEL_PY}", f"c0ffee:{SAMPLER_PY}"]
    model_host = str(dest) + MODEL_PY
    sampler_host = str(dest) + SAMPLER_PY
    assert outcome.changed is True and outcome.removed == []
    assert outcome.written == [model_host, sampler_host]
    assert outcome.mounts == [f"{model_host}:{MODEL_PY}:ro", f"{sampler_host}:{SAMPLER_PY}:ro"]
    assert outcome.results == [
        {"path": MODEL_PY, "host_path": model_host, "sha256": sha(MODEL_PATCHED)},
        {"path": SAMPLER_PY, "host_path": sampler_host, "sha256": sha(SAMPLER_PATCHED)},
    ]
    assert sha(Path(model_host).read_bytes()) == sha(MODEL_PATCHED)
    assert sha(Path(sampler_host).read_bytes()) == sha(SAMPLER_PATCHED)
    assert os.stat(model_host).st_mode & 0o777 == 0o644
    assert os.stat(os.path.dirname(model_host)).st_mode & 0o777 == 0o755
    assert sorted(tree(dest)) == [".sparkserve-overlay", MODEL_PY[1:], SAMPLER_PY[1:]]  # no temporary file left


def test_second_run_changes_nothing_and_does_not_call_docker(tmp_path: Path) -> None:
    dest = tmp_path / "lab"
    io_mod.converge(IMAGE, str(dest), recipe_files(), runner=FakeDocker(originals()))
    docker = FakeDocker(originals())
    outcome = io_mod.converge(IMAGE, str(dest), recipe_files(), runner=docker)
    assert outcome.changed is False and outcome.written == [] and outcome.removed == []
    assert docker.calls == []
    assert len(outcome.mounts) == 2


def test_only_the_wrong_result_is_remade(tmp_path: Path) -> None:
    dest = tmp_path / "lab"
    io_mod.converge(IMAGE, str(dest), recipe_files(), runner=FakeDocker(originals()))
    (dest / SAMPLER_PY[1:]).write_text("edited by hand\n")
    docker = FakeDocker(originals())
    outcome = io_mod.converge(IMAGE, str(dest), recipe_files(), runner=docker)
    assert outcome.written == [str(dest) + SAMPLER_PY]
    assert [argv[2] for argv in docker.calls if argv[1] == "cp"] == [f"c0ffee:{SAMPLER_PY}"]
    assert (dest / SAMPLER_PY[1:]).read_text() == SAMPLER_PATCHED


def test_a_new_image_is_checked_again_though_the_results_are_in_place(tmp_path: Path) -> None:
    dest = tmp_path / "lab"
    io_mod.converge(IMAGE, str(dest), recipe_files(), runner=FakeDocker(originals()))
    before = tree(dest)
    newer = IMAGE.split("@")[0] + "@sha256:" + "ee" * 32
    changed = dict(originals(), **{MODEL_PY: MODEL.replace("line 20\n", "line 20 v2\n").encode()})
    docker = FakeDocker(changed)
    with pytest.raises(io_mod.OverlayError) as err:
        io_mod.converge(newer, str(dest), recipe_files(), runner=docker)
    assert "original sha256 is %s, the recipe expects %s" % (sha(changed[MODEL_PY]), sha(MODEL)) in err.value.msg
    assert tree(dest) == before  # the results of the image before stay as they were


def test_a_changed_original_hash_in_the_recipe_is_checked_against_the_image(tmp_path: Path) -> None:
    dest = tmp_path / "lab"
    io_mod.converge(IMAGE, str(dest), recipe_files(), runner=FakeDocker(originals()))
    docker = FakeDocker(originals())
    with pytest.raises(io_mod.OverlayError) as err:
        io_mod.converge(IMAGE, str(dest), recipe_files(original_sha256="0" * 64), runner=docker)
    assert [argv[2] for argv in docker.calls if argv[1] == "cp"] == [f"c0ffee:{MODEL_PY}"]
    assert err.value.errors == [f"{MODEL_PY}: original sha256 is {sha(MODEL)}, the recipe expects {'0' * 64}: "
                                "the image is not the one the overlay was made for"]


def test_original_hash_mismatch_fails_and_writes_nothing(tmp_path: Path) -> None:
    dest = tmp_path / "lab"
    other = dict(originals(), **{MODEL_PY: MODEL.replace("line 20\n", "line 20 v2\n").encode()})
    docker = FakeDocker(other)
    with pytest.raises(io_mod.OverlayError) as err:
        io_mod.converge(IMAGE, str(dest), recipe_files(), runner=docker)
    docker.check_safe()
    assert err.value.errors == [
        f"{MODEL_PY}: original sha256 is {sha(other[MODEL_PY])}, the recipe expects {sha(MODEL)}: "
        "the image is not the one the overlay was made for"]
    assert tree(dest) == {}  # the good sampler.py is not written either


def test_patch_failing_at_zero_fuzz_fails_and_writes_nothing(tmp_path: Path) -> None:
    dest = tmp_path / "lab"
    drifted = MODEL.replace("line 29\n", "line 29 upstream\n")
    files = recipe_files(original_sha256=sha(drifted))  # the right image, a patch made against another file
    docker = FakeDocker(dict(originals(), **{MODEL_PY: drifted.encode()}))
    with pytest.raises(io_mod.OverlayError) as err:
        io_mod.converge(IMAGE, str(dest), files, runner=docker)
    docker.check_safe()
    (message,) = err.value.errors
    assert message.startswith(f"{MODEL_PY}: the patch does not apply at zero fuzz to the original "
                              f"(sha256 {sha(drifted)})")
    assert "hunk 2 (@@ -28,6 +28,7 @@): line 29: expected 'line 29\\n', found 'line 29 upstream\\n'" in message
    assert tree(dest) == {}


def test_result_hash_mismatch_fails_and_writes_nothing(tmp_path: Path) -> None:
    dest = tmp_path / "lab"
    docker = FakeDocker(originals())
    with pytest.raises(io_mod.OverlayError) as err:
        io_mod.converge(IMAGE, str(dest), recipe_files(result_sha256="e" * 64), runner=docker)
    docker.check_safe()
    assert err.value.errors == [
        f"{MODEL_PY}: the patched file's sha256 is {sha(MODEL_PATCHED)}, the recipe expects {'e' * 64}"]
    assert tree(dest) == {}


def test_a_file_missing_from_the_image_fails_and_the_container_is_removed(tmp_path: Path) -> None:
    docker = FakeDocker({MODEL_PY: MODEL.encode()})
    with pytest.raises(io_mod.OverlayError, match=f"{SAMPLER_PY}: could not be read from {IMAGE}: .*Could not find"):
        io_mod.converge(IMAGE, str(tmp_path / "lab"), recipe_files(), runner=docker)
    docker.check_safe()
    assert not (tmp_path / "lab").exists()


def test_a_link_in_the_image_is_refused() -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        info = tarfile.TarInfo("model.py")
        info.type, info.linkname = tarfile.SYMTYPE, "../real/model.py"
        tar.addfile(info)
    with pytest.raises(ValueError, match=r"is a link in the image \(to ../real/model.py\)"):
        io_mod.read_tar_member(buffer.getvalue(), MODEL_PY)


def test_check_mode_checks_everything_and_writes_nothing(tmp_path: Path) -> None:
    dest = tmp_path / "lab"
    docker = FakeDocker(originals())
    outcome = io_mod.converge(IMAGE, str(dest), recipe_files(), check_mode=True, runner=docker, want_diff=True)
    docker.check_safe()
    assert outcome.changed is True and outcome.written == [str(dest) + MODEL_PY, str(dest) + SAMPLER_PY]
    assert not dest.exists()
    assert outcome.diff[1]["before"] == SAMPLER and outcome.diff[1]["after"] == SAMPLER_PATCHED
    assert outcome.diff[1]["before_header"] == f"{IMAGE}:{SAMPLER_PY} (the image's original)"
    with pytest.raises(io_mod.OverlayError, match="the recipe expects"):  # check mode still checks the hashes
        io_mod.converge(IMAGE, str(dest), recipe_files(result_sha256="e" * 64), check_mode=True,
                        runner=FakeDocker(originals()))


def test_stale_overlays_are_removed_and_reported(tmp_path: Path) -> None:
    dest = tmp_path / "lab"
    io_mod.converge(IMAGE, str(dest), recipe_files(), runner=FakeDocker(originals()))
    old = dest / "usr/lib/python3/dist-packages/vllm/old/gone.py"
    old.parent.mkdir(parents=True)
    old.write_text("from an older set\n")
    checked = io_mod.converge(IMAGE, str(dest), recipe_files(), check_mode=True, runner=FakeDocker({}))
    assert checked.changed is True and checked.removed == [str(old)] and old.exists()
    docker = FakeDocker(originals())
    outcome = io_mod.converge(IMAGE, str(dest), recipe_files()[1:], runner=docker)  # model.py left the set
    assert docker.calls == []
    assert outcome.changed is True and outcome.written == []
    assert outcome.removed == [str(dest) + MODEL_PY, str(old)]
    assert not old.exists() and not old.parent.exists()  # the folder it left empty goes too
    assert sorted(tree(dest)) == [".sparkserve-overlay", SAMPLER_PY[1:]]


def test_a_folder_not_made_by_the_module_is_never_emptied(tmp_path: Path) -> None:
    (tmp_path / "precious.db").write_text("keep me\n")
    with pytest.raises(io_mod.OverlayError, match="no .sparkserve-overlay marker"):
        io_mod.converge(IMAGE, str(tmp_path), recipe_files(), runner=FakeDocker(originals()))
    assert (tmp_path / "precious.db").read_text() == "keep me\n"


def test_arguments_are_checked() -> None:
    files = recipe_files(path="relative/x.py", result_sha256="nothex")
    with pytest.raises(io_mod.OverlayError) as err:
        io_mod.converge("vllm/vllm-openai:latest", "/", files, runner=FakeDocker({}))
    assert len(err.value.errors) == 4
    assert "not pinned by digest" in err.value.errors[0]


def test_main_writes_with_a_diff_then_reports_no_change(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    docker = FakeDocker(originals())
    monkeypatch.setattr(io_mod, "run", docker)
    args = {"image": IMAGE, "dest": str(tmp_path / "lab"), "files": recipe_files(), "_ansible_diff": True}
    out = run_main(args, capsys)
    assert out["changed"] is True and out["removed"] == []
    assert out["mounts"][0] == f"{tmp_path}/lab{MODEL_PY}:{MODEL_PY}:ro"
    assert out["diff"][0]["after"] == MODEL_PATCHED
    docker.check_safe()
    docker.calls.clear()
    again = run_main(args, capsys)
    assert again["changed"] is False and "diff" not in again and docker.calls == []


def test_main_fails_naming_the_file_and_hashes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(io_mod, "run", FakeDocker(originals()))
    files = recipe_files(original_sha256="0" * 64)
    out = run_main({"image": IMAGE, "dest": str(tmp_path / "lab"), "files": files, "_ansible_check_mode": True}, capsys)
    assert out["failed"] is True and out["changed"] is False
    assert f"{MODEL_PY}: original sha256 is {sha(MODEL)}, the recipe expects {'0' * 64}" in out["msg"]
    assert not (tmp_path / "lab").exists()


def test_main_reads_a_patch_file_on_the_node_as_the_same_patch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(io_mod, "run", FakeDocker(originals()))
    by_text = run_main({"image": IMAGE, "dest": str(tmp_path / "text"), "files": recipe_files()}, capsys)
    patch = tmp_path / "repo" / "model.diff"
    patch.parent.mkdir()
    patch.write_text(make_patch(MODEL, MODEL_PATCHED, "vllm/model.py"), encoding="utf-8")
    files = recipe_files()
    files[0] = {key: value for key, value in files[0].items() if key != "patch"} | {"patch_file": str(patch)}
    by_file = run_main({"image": IMAGE, "dest": str(tmp_path / "file"), "files": files}, capsys)
    assert by_file["changed"] is True
    assert tree(tmp_path / "file") == tree(tmp_path / "text") and by_text["changed"] is True


def test_main_fails_naming_a_patch_file_it_cannot_read_and_one_given_twice(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(io_mod, "run", FakeDocker(originals()))
    missing = str(tmp_path / "repo" / "model.diff")
    files = recipe_files()
    files[0] = {key: value for key, value in files[0].items() if key != "patch"} | {"patch_file": missing}
    out = run_main({"image": IMAGE, "dest": str(tmp_path / "lab"), "files": files}, capsys)
    assert out["failed"] is True and f"{MODEL_PY}: cannot read its patch {missing}" in out["msg"]
    assert not (tmp_path / "lab").exists()
    both = recipe_files(patch_file=missing)
    out = run_main({"image": IMAGE, "dest": str(tmp_path / "lab"), "files": both}, capsys)
    assert out["failed"] is True and "mutually exclusive: patch|patch_file" in out["msg"]


def test_main_fails_when_the_image_cannot_be_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    docker = FakeDocker(originals(), create_rc=1)
    monkeypatch.setattr(io_mod, "run", docker)
    out = run_main({"image": IMAGE, "dest": str(tmp_path / "lab"), "files": recipe_files()}, capsys)
    assert out["failed"] is True and f"could not create a container of {IMAGE}" in out["msg"]
    assert [argv[1] for argv in docker.calls] == ["create"]  # no container, nothing to remove


def test_an_image_the_node_lacks_is_never_pulled_and_named_as_the_image_stages(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    local = IMAGE.replace("@sha256:", ":sha256-")
    docker = FakeDocker(originals(), create_rc=1, create_err=f"Error: No such image: {local}\n")
    monkeypatch.setattr(io_mod, "run", docker)
    out = run_main({"image": local, "dest": str(tmp_path / "lab"), "files": recipe_files()}, capsys)
    assert out["failed"] is True
    assert out["msg"] == (f"the image {local} is not on this node: the image stage brings it before the overlays "
                          "(site.yml --tags image)")
    assert docker.calls[0][:4] == ["docker", "create", "--pull", "never"]
    # In check mode before the image stage ran: what would be written, and nothing written.
    checked = run_main({"image": local, "dest": str(tmp_path / "lab"), "files": recipe_files(),
                        "_ansible_check_mode": True}, capsys)
    assert checked["changed"] is True and "failed" not in checked
    assert checked["written"] == [str(tmp_path / "lab") + MODEL_PY, str(tmp_path / "lab") + SAMPLER_PY]
    assert any("not checked against it" in str(w) for w in checked.get("warnings", []))
    assert not (tmp_path / "lab").exists()


def test_the_local_name_and_the_digest_name_make_the_same_record(tmp_path: Path) -> None:
    dest = tmp_path / "lab"
    io_mod.converge(IMAGE, str(dest), recipe_files(), runner=FakeDocker(originals()))
    local = IMAGE.replace("@sha256:", ":sha256-")
    docker = FakeDocker(originals())
    again = io_mod.converge(local, str(dest), recipe_files(), runner=docker)
    assert again.changed is False and docker.calls == []
