"""Tests for lab/build_image.py: spec checks, the input hash, the build steps."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Sequence

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "lab" / "build_image.py"
_spec = importlib.util.spec_from_file_location("build_image", SCRIPT)
assert _spec is not None and _spec.loader is not None
build_image = importlib.util.module_from_spec(_spec)
sys.modules["build_image"] = build_image
_spec.loader.exec_module(build_image)


def write_spec(folder: Path, text: str) -> Path:
    path = folder / "image.yml"
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture()
def spec_dir(tmp_path: Path) -> Path:
    rootfs = tmp_path / "rootfs" / "etc"
    rootfs.mkdir(parents=True)
    (rootfs / "motd").write_text("hello\n", encoding="utf-8")
    write_spec(
        tmp_path,
        "name: sparkserve-lab/test\nsuite: bookworm\npackages: [python3, curl]\nrootfs: rootfs\n"
        "remove: [etc/machine-id]\nchanges: ['CMD [\"/sbin/init\"]']\n",
    )
    return tmp_path


def test_spec_loads_and_sorts_packages(spec_dir: Path) -> None:
    spec = build_image.ImageSpec.load(spec_dir / "image.yml")
    assert spec.name == "sparkserve-lab/test"
    assert spec.packages == ("curl", "python3")
    assert spec.variant == "minbase"
    assert spec.rootfs == (spec_dir / "rootfs").resolve()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("suite: bookworm\npackages: []\n", "'name' is required"),
        ("name: Bad Name\nsuite: bookworm\npackages: []\n", "not a valid image repository"),
        ("name: a/b\nsuite: bookworm\npackages: curl\n", "packages is a list"),
        ("name: a/b\nsuite: bookworm\npackages: []\nrootfs: nowhere\n", "rootfs folder nowhere does not exist"),
        ("- just\n- a list\n", "is a mapping"),
    ],
)
def test_bad_specs_are_refused_with_the_reason(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(build_image.SpecError, match=message):
        build_image.ImageSpec.load(write_spec(tmp_path, text))


def test_hash_follows_every_input(spec_dir: Path) -> None:
    spec_path = spec_dir / "image.yml"
    base = build_image.inputs_hash(build_image.ImageSpec.load(spec_path))
    assert base == build_image.inputs_hash(build_image.ImageSpec.load(spec_path))

    spec_path.write_text("# a comment changes nothing\n" + spec_path.read_text(encoding="utf-8"), encoding="utf-8")
    assert build_image.inputs_hash(build_image.ImageSpec.load(spec_path)) == base

    motd = spec_dir / "rootfs" / "etc" / "motd"
    motd.write_text("changed\n", encoding="utf-8")
    content_changed = build_image.inputs_hash(build_image.ImageSpec.load(spec_path))
    assert content_changed != base

    motd.chmod(0o600)
    assert build_image.inputs_hash(build_image.ImageSpec.load(spec_path)) != content_changed

    spec_path.write_text(spec_path.read_text(encoding="utf-8").replace("curl", "rsync"), encoding="utf-8")
    assert build_image.inputs_hash(build_image.ImageSpec.load(spec_path)) != content_changed


def test_hash_ignores_python_caches(spec_dir: Path) -> None:
    spec = build_image.ImageSpec.load(spec_dir / "image.yml")
    before = build_image.inputs_hash(spec)
    cache = spec_dir / "rootfs" / "etc" / "__pycache__"
    cache.mkdir()
    (cache / "x.cpython-311.pyc").write_bytes(b"\0")
    assert build_image.inputs_hash(spec) == before


def test_hash_sees_symlink_targets(spec_dir: Path) -> None:
    link = spec_dir / "rootfs" / "etc" / "unit.service"
    link.symlink_to("/etc/systemd/system/a.service")
    spec = build_image.ImageSpec.load(spec_dir / "image.yml")
    first = build_image.inputs_hash(spec)
    link.unlink()
    link.symlink_to("/etc/systemd/system/b.service")
    assert build_image.inputs_hash(spec) != first


def test_apt_mirror_reads_deb822_and_classic(tmp_path: Path) -> None:
    deb822 = tmp_path / "debian.sources"
    deb822.write_text(
        "Types: deb\nURIs: http://mirror.example/debian-security\nSuites: bookworm-security\n\n"
        "Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm\n",
        encoding="utf-8",
    )
    # the security archive comes first in the file but is not a base mirror
    assert build_image.apt_mirror([deb822]) == "http://mirror.example/debian"


def test_apt_mirror_skips_security_suites(tmp_path: Path) -> None:
    classic = tmp_path / "sources.list"
    classic.write_text(
        "deb http://mirror.example/debian-security bookworm-security main\n"
        "deb [arch=amd64] http://mirror.example/debian bookworm main\n",
        encoding="utf-8",
    )
    assert build_image.apt_mirror([tmp_path / "missing", classic]) == "http://mirror.example/debian"
    assert build_image.apt_mirror([tmp_path / "missing"]) is None


def test_remove_paths_stays_inside_the_root(tmp_path: Path) -> None:
    (tmp_path / "etc" / "ssh").mkdir(parents=True)
    (tmp_path / "etc" / "ssh" / "ssh_host_rsa_key").write_text("k", encoding="utf-8")
    (tmp_path / "etc" / "ssh" / "ssh_host_ed25519_key").write_text("k", encoding="utf-8")
    (tmp_path / "etc" / "ssh" / "sshd_config").write_text("c", encoding="utf-8")
    removed = build_image.remove_paths(tmp_path, ["etc/ssh/ssh_host_*", "etc/absent"])
    assert removed == ["etc/ssh/ssh_host_ed25519_key", "etc/ssh/ssh_host_rsa_key"]
    assert (tmp_path / "etc" / "ssh" / "sshd_config").exists()
    with pytest.raises(build_image.SpecError, match="inside the root"):
        build_image.remove_paths(tmp_path, ["../etc"])
    with pytest.raises(build_image.SpecError, match="inside the root"):
        build_image.remove_paths(tmp_path, ["/etc/passwd"])


def test_build_runs_debootstrap_overlay_and_import(spec_dir: Path, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(build_image, "apt_mirror", lambda: "http://mirror.example/debian")
    calls: list[list[str]] = []

    def fake(cmd: Sequence[str]) -> subprocess.CompletedProcess[str]:
        calls.append(list(cmd))
        if cmd[0] == "debootstrap":
            root = Path(cmd[-2])
            (root / "etc").mkdir(parents=True)
            (root / "etc" / "machine-id").write_text("abc\n", encoding="utf-8")
            (root / "var" / "lib" / "apt" / "lists").mkdir(parents=True)
            (root / "var" / "lib" / "apt" / "lists" / "index").write_text("x", encoding="utf-8")
        return subprocess.CompletedProcess(list(cmd), 0, "", "")

    work = tmp_path / "work"
    work.mkdir()
    spec = build_image.ImageSpec.load(spec_dir / "image.yml")
    image = build_image.build(spec, "0123456789abcdef", work, runner=fake)

    assert image == "sparkserve-lab/test:0123456789abcdef"
    debootstrap, tar, docker_import = calls
    assert debootstrap[:3] == ["debootstrap", "--variant=minbase", "--include=curl,python3"]
    assert debootstrap[-3:] == ["bookworm", str(work / "root"), "http://mirror.example/debian"]
    assert tar[0] == "tar" and str(work / "root") in tar
    assert docker_import == ["docker", "import", "--change", 'CMD ["/sbin/init"]', str(work / "root.tar"), image]
    root = work / "root"
    assert (root / "etc" / "motd").read_text(encoding="utf-8") == "hello\n"
    assert not (root / "etc" / "machine-id").exists()
    assert not (root / "var" / "lib" / "apt" / "lists" / "index").exists()


def test_main_builds_nothing_when_the_image_exists(spec_dir: Path, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(build_image, "image_exists", lambda image: True)
    monkeypatch.setattr(build_image, "build", lambda *a, **k: pytest.fail("must not build"))
    assert build_image.main(["--spec", str(spec_dir / "image.yml")]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["built"] is False
    assert out["image"] == "sparkserve-lab/test:" + out["inputs_hash"][:16]


def test_main_dry_run_reports_a_build_without_building(spec_dir: Path, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(build_image, "image_exists", lambda image: False)
    monkeypatch.setattr(build_image, "build", lambda *a, **k: pytest.fail("must not build"))
    assert build_image.main(["--spec", str(spec_dir / "image.yml"), "--dry-run"]) == 0
    assert json.loads(capsys.readouterr().out)["built"] is True


def test_main_reports_a_failed_step(spec_dir: Path, monkeypatch: pytest.MonkeyPatch,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(build_image, "image_exists", lambda image: False)

    def broken(*args: object, **kwargs: object) -> str:
        raise subprocess.CalledProcessError(1, ["debootstrap", "--variant=minbase"], "",
                                            "E: Couldn't download packages\n")

    monkeypatch.setattr(build_image, "build", broken)
    assert build_image.main(["--spec", str(spec_dir / "image.yml"), "--workdir", str(spec_dir / "w")]) == 1
    assert "debootstrap --variant=minbase failed (rc=1): E: Couldn't download packages" in capsys.readouterr().err


def test_main_refuses_a_bad_spec(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert build_image.main(["--spec", str(write_spec(tmp_path, "suite: bookworm\n"))]) == 2
    assert "'name' is required" in capsys.readouterr().err


def derived_spec(spec_dir: Path) -> Path:
    engine = spec_dir / "engine"
    engine.mkdir()
    (engine / "Dockerfile").write_text("ARG BASE\nFROM ${BASE}\nCOPY app /opt/app\n", encoding="utf-8")
    (engine / "app").write_text("print('v1')\n", encoding="utf-8")
    return write_spec(engine, "name: sparkserve-lab/engine\nbase: ../image.yml\ndockerfile: Dockerfile\n")


def test_a_derived_image_hashes_its_base_and_its_context(spec_dir: Path) -> None:
    path = derived_spec(spec_dir)
    spec = build_image.ImageSpec.load(path)
    assert spec.base is not None and spec.base.name == "sparkserve-lab/test"
    first = build_image.inputs_hash(spec)
    (spec_dir / "engine" / "app").write_text("print('v2')\n", encoding="utf-8")
    second = build_image.inputs_hash(spec)
    assert second != first
    (spec_dir / "rootfs" / "etc" / "motd").write_text("base changed\n", encoding="utf-8")
    assert build_image.inputs_hash(spec) != second
    assert [one.name for one in build_image.chain_of(spec)] == ["sparkserve-lab/test", "sparkserve-lab/engine"]


def test_a_derived_image_is_built_from_its_base_reference(spec_dir: Path) -> None:
    spec = build_image.ImageSpec.load(derived_spec(spec_dir))
    calls: list[list[str]] = []

    def fake(cmd: Sequence[str]) -> subprocess.CompletedProcess[str]:
        calls.append(list(cmd))
        return subprocess.CompletedProcess(list(cmd), 0, "", "")

    image = build_image.build(spec, "feedfacecafebeef", spec_dir, runner=fake)
    assert image == "sparkserve-lab/engine:feedfacecafebeef"
    (docker_build,) = calls
    assert docker_build[:3] == ["docker", "build", "--quiet"]
    assert f"BASE={build_image.image_ref(spec.base)}" in docker_build
    assert docker_build[-1] == str(spec_dir / "engine")


def test_main_builds_only_the_missing_images_of_the_chain(spec_dir: Path, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    path = derived_spec(spec_dir)
    spec = build_image.ImageSpec.load(path)
    present = {build_image.image_ref(spec.base)}
    monkeypatch.setattr(build_image, "image_exists", lambda image: image in present)
    built: list[str] = []
    monkeypatch.setattr(build_image, "build",
                        lambda one, tag, work, runner=None: built.append(one.name) or f"{one.name}:{tag}")
    assert build_image.main(["--spec", str(path), "--workdir", str(spec_dir / "w")]) == 0
    assert built == ["sparkserve-lab/engine"]
    assert json.loads(capsys.readouterr().out)["built"] is True


def test_a_derived_spec_needs_its_dockerfile(spec_dir: Path) -> None:
    engine = spec_dir / "engine"
    engine.mkdir()
    with pytest.raises(build_image.SpecError, match="dockerfile Dockerfile does not exist"):
        build_image.ImageSpec.load(write_spec(engine, "name: a/b\nbase: ../image.yml\ndockerfile: Dockerfile\n"))


def other_root_spec(spec_dir: Path) -> Path:
    other = spec_dir / "other"
    other.mkdir()
    return write_spec(other, "name: sparkserve-lab/other\nsuite: bookworm\npackages: [curl]\n")


def test_main_builds_images_of_different_roots_at_once(spec_dir: Path, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    # Each build waits until the other has started: one at a time, the first would wait alone and break the barrier.
    both_started = threading.Barrier(2, timeout=60)
    monkeypatch.setattr(build_image, "image_exists", lambda image: False)

    def fake(one: Any, tag: str, work: Path, runner: object = None) -> str:
        both_started.wait()
        assert work.is_dir()
        return f"{one.name}:{tag}"

    monkeypatch.setattr(build_image, "build", fake)
    paths = [spec_dir / "image.yml", other_root_spec(spec_dir)]
    assert build_image.main([arg for path in paths for arg in ("--spec", str(path))]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["image"].split(":")[0] for line in lines] == ["sparkserve-lab/test", "sparkserve-lab/other"]
    assert all(line["built"] for line in lines)


def test_a_shared_base_is_built_once_before_the_image_on_it(spec_dir: Path, monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    derived = derived_spec(spec_dir)
    monkeypatch.setattr(build_image, "image_exists", lambda image: False)
    events: list[str] = []
    lock = threading.Lock()

    def fake(one: Any, tag: str, work: Path, runner: object = None) -> str:
        name = one.name
        with lock:
            events.append("start " + name)
        with lock:
            events.append("end " + name)
        return f"{name}:{tag}"

    monkeypatch.setattr(build_image, "build", fake)
    assert build_image.main(["--spec", str(derived), "--spec", str(spec_dir / "image.yml")]) == 0
    assert events == ["start sparkserve-lab/test", "end sparkserve-lab/test",
                      "start sparkserve-lab/engine", "end sparkserve-lab/engine"]
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(line["image"].split(":")[0], line["built"]) for line in lines] == [
        ("sparkserve-lab/engine", True), ("sparkserve-lab/test", True)]


def test_a_failed_base_builds_nothing_on_it_and_reports_once(spec_dir: Path, monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    derived = derived_spec(spec_dir)
    monkeypatch.setattr(build_image, "image_exists", lambda image: False)
    built: list[str] = []

    def fake(one: Any, tag: str, work: Path, runner: object = None) -> str:
        name = one.name
        if name == "sparkserve-lab/test":
            raise subprocess.CalledProcessError(100, ["debootstrap", "--variant=minbase"], "", "E: no mirror\n")
        built.append(name)
        return f"{name}:{tag}"

    monkeypatch.setattr(build_image, "build", fake)
    assert build_image.main(["--spec", str(derived), "--spec", str(other_root_spec(spec_dir))]) == 1
    out = capsys.readouterr()
    assert built == ["sparkserve-lab/other"]
    assert out.out == ""
    assert out.err.count("debootstrap --variant=minbase failed (rc=100): E: no mirror") == 1


def test_images_already_built_are_reported_as_not_built(spec_dir: Path, monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    derived = derived_spec(spec_dir)
    base = build_image.ImageSpec.load(spec_dir / "image.yml")
    present = {build_image.image_ref(base)}
    monkeypatch.setattr(build_image, "image_exists", lambda image: image in present)
    monkeypatch.setattr(build_image, "build", lambda one, tag, work, runner=None: f"{one.name}:{tag}")
    assert build_image.main(["--spec", str(spec_dir / "image.yml"), "--spec", str(derived)]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["built"] for line in lines] == [False, True]
