"""`sparkserve recipe pin`: tags to digests and branches to commits, against a registry and a hub on loopback."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from ansible.constants import DEFAULT_VAULT_ID_MATCH
from ansible.parsing.vault import VaultLib, VaultSecret

from sparkserve.cli import Context, main
from sparkserve.recipe_pin import Credentials, ImageRef, PinError, Resolver, apply, plan

USER, PASSWORD = "puller", "registry-password-never-shown"
HUB_TOKEN = "hf_token_never_shown"
COMMIT_A, COMMIT_B = "a" * 40, "b" * 40


@dataclass
class Remote:
    """What the registry and the hub double hold: manifests by repository and tag, commits by repo and branch."""

    manifests: dict[tuple[str, str], bytes] = field(default_factory=dict)
    branches: dict[tuple[str, str], str] = field(default_factory=dict)
    auth: bool = False  # the registry asks for a bearer token, given for basic credentials
    gated: bool = False  # the hub asks for HUB_TOKEN
    seen_headers: list[str] = field(default_factory=list)


def digest_of(body: bytes) -> str:
    return "sha256:" + hashlib.sha256(body).hexdigest()


@pytest.fixture
def remote() -> Iterator[tuple[Remote, str]]:
    state = Remote()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def answer(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
            self.send_response(status)
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            state.seen_headers += [f"{k}: {v}" for k, v in self.headers.items()]
            host = self.headers["Host"]
            if self.path.startswith("/token"):
                basic = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
                if self.headers.get("Authorization") != basic:
                    return self.answer(401, b"{}")
                return self.answer(200, json.dumps({"token": "registry-token"}).encode())
            if self.path.startswith("/v2/"):
                if state.auth and self.headers.get("Authorization") != "Bearer registry-token":
                    challenge = f'Bearer realm="http://{host}/token",service="lab",scope="repository:x:pull"'
                    return self.answer(401, b"{}", {"WWW-Authenticate": challenge})
                repo, _, tag = self.path[len("/v2/"):].partition("/manifests/")
                body = state.manifests.get((repo, tag))
                if body is None:
                    return self.answer(404, b'{"errors":[{"code":"MANIFEST_UNKNOWN"}]}')
                return self.answer(200, body, {"Docker-Content-Digest": digest_of(body),
                                               "Content-Type": "application/vnd.oci.image.index.v1+json"})
            if self.path.startswith("/api/models/"):
                if state.gated and self.headers.get("Authorization") != f"Bearer {HUB_TOKEN}":
                    return self.answer(401, b'{"error":"gated"}')
                repo, _, branch = self.path[len("/api/models/"):].partition("/revision/")
                sha = state.branches.get((repo, branch))
                if sha is None:
                    return self.answer(404, b'{"error":"RevisionNotFound"}')
                return self.answer(200, json.dumps({"id": repo, "sha": sha}).encode())
            return self.answer(404, b"{}")

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


RECIPE = """\
# An imported recipe, floating.
name: imported
engine: vllm
image: registry.example:5000/team/vllm:25.11  # the team's build
model:
  repo: org/model
  revision: main   # follow main
  served_name: model
draft_model: {repo: org/draft, revision: v1}
"""


def resolver(url: str, credentials: Credentials | None = None) -> Resolver:
    return Resolver(credentials or Credentials(), {"registry.example:5000": url}, url)


def publish(state: Remote) -> bytes:
    manifest = b'{"schemaVersion": 2, "manifests": []}'
    state.manifests[("team/vllm", "25.11")] = manifest
    state.branches[("org/model", "main")] = COMMIT_A
    state.branches[("org/draft", "v1")] = COMMIT_B
    return manifest


@pytest.mark.parametrize(("text", "registry", "path", "tag", "digest"), [
    ("nvcr.io/nvidia/vllm:25.11-py3", "nvcr.io", "nvidia/vllm", "25.11-py3", None),
    ("vllm/vllm-openai:latest", "docker.io", "vllm/vllm-openai", "latest", None),
    ("ubuntu", "docker.io", "library/ubuntu", None, None),
    ("localhost:5000/x:y@sha256:" + "c" * 64, "localhost:5000", "x", "y", "sha256:" + "c" * 64),
])
def test_an_image_reference_is_taken_apart_as_docker_reads_it(text: str, registry: str, path: str, tag: str | None,
                                                             digest: str | None) -> None:
    ref = ImageRef.parse(text)
    assert (ref.registry, ref.path, ref.tag, ref.digest) == (registry, path, tag, digest)
    written = text.partition("@")[0] if tag else text.partition("@")[0] + ":latest"
    assert ref.pinned("sha256:" + "d" * 64) == f"{written}@sha256:{'d' * 64}"


def test_a_tag_and_two_branches_are_pinned_in_place_keeping_comments(remote: tuple[Remote, str]) -> None:
    state, url = remote
    manifest = publish(state)
    pins = plan(RECIPE, resolver(url))
    assert [(p.field, p.follows, p.before) for p in pins] == [
        ("image", "registry.example:5000/team/vllm:25.11", "registry.example:5000/team/vllm:25.11"),
        ("model.revision", "org/model@main", "main"),
        ("draft_model.revision", "org/draft@v1", "v1")]
    pinned = apply(RECIPE, pins)
    assert pinned == RECIPE.replace(
        "vllm:25.11  #", f"vllm:25.11@{digest_of(manifest)}  #").replace(
        "  revision: main   # follow main\n", f"  revision: {COMMIT_A}   # follow main\n  track: main\n").replace(
        "revision: v1}", f"revision: {COMMIT_B}, track: v1}}")
    # Pinned: nothing moves, nothing is added.
    assert [p.field for p in plan(pinned, resolver(url)) if p.moved or p.add_track] == []


def test_a_registry_that_asks_for_a_token_gets_one_for_the_vault_credentials(remote: tuple[Remote, str]) -> None:
    state, url = remote
    manifest = publish(state)
    state.auth = True
    with pytest.raises(PinError) as refused:
        plan(RECIPE, resolver(url))
    assert "sparkserve_registry_credentials" in str(refused.value) and "registry.example:5000" in str(refused.value)
    login = Credentials({"registry.example:5000": (USER, PASSWORD)})
    assert plan(RECIPE, resolver(url, login))[0].after.endswith(digest_of(manifest))


def test_a_gated_repository_needs_the_hub_token_and_no_error_shows_a_secret(remote: tuple[Remote, str]) -> None:
    state, url = remote
    publish(state)
    state.gated = True
    with pytest.raises(PinError) as refused:
        plan(RECIPE, resolver(url))
    assert "weights_hf_token" in str(refused.value) and "model.revision" in str(refused.value)
    assert plan(RECIPE, resolver(url, Credentials(hub_token=HUB_TOKEN)))[1].after == COMMIT_A


@pytest.mark.parametrize(("missing", "field_name"), [(("team/vllm", "25.11"), "image"),
                                                    (("org/model", "main"), "model.revision")])
def test_a_missing_tag_or_branch_is_one_sentence_naming_the_field(remote: tuple[Remote, str], missing: tuple[str, str],
                                                                  field_name: str) -> None:
    state, url = remote
    publish(state)
    state.manifests.pop(missing, None)
    state.branches.pop(missing, None)
    with pytest.raises(PinError) as refused:
        plan(RECIPE, resolver(url))
    message = str(refused.value)
    assert f"recipe field {field_name}" in message and missing[1] in message and "Client Error" not in message


def command(project: Path, args: list[str], tty: bool = False, answer: str = "") -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    ctx = Context(root=project, cwd=project, environ={}, stdout=out, stderr=err, tty=tty, ask=lambda _: answer,
                  ask_password=lambda _: "vault-pass")
    return main(["recipe", *args], ctx), out.getvalue(), err.getvalue()


def test_the_command_shows_the_diff_writes_on_yes_and_check_says_when_a_branch_moved(
        project: Path, remote: tuple[Remote, str]) -> None:
    state, url = remote
    publish(state)
    (project / "recipes").mkdir()
    recipe = project / "recipes" / "imported.yml"
    recipe.write_text(RECIPE)
    flags = ["--registry", f"registry.example:5000={url}", "--hub-endpoint", url]
    # Not a terminal and no --yes: the diff, then a usage error; nothing written.
    code, out, err = command(project, ["pin", "imported", *flags])
    assert code == 2 and "+  track: main" in out and "--yes" in err and recipe.read_text() == RECIPE
    # Asked on a terminal, answered no: nothing written.
    assert command(project, ["pin", "imported", *flags], tty=True, answer="n")[0] == 0
    assert recipe.read_text() == RECIPE
    # Floating values: --check has nothing pinned to compare yet, and says which fields move.
    code, out, _ = command(project, ["pin", "imported", "--check", *flags])
    assert code == 1 and "image: registry.example:5000/team/vllm:25.11 now points to" in out
    code, out, _ = command(project, ["pin", "imported", "--yes", *flags])
    assert code == 0 and f"revision: {COMMIT_A}" in recipe.read_text()
    pinned = recipe.read_text()
    code, out, _ = command(project, ["pin", "imported", "--check", *flags])
    assert code == 0 and "nothing it follows has moved" in out
    # The hub moves main: --check exits 1 naming the field, and touches nothing.
    state.branches[("org/model", "main")] = "e" * 40
    code, out, _ = command(project, ["pin", "imported", "--check", *flags])
    assert code == 1 and recipe.read_text() == pinned
    assert f"model.revision: org/model@main now points to {'e' * 40}; the recipe has {COMMIT_A}" in out
    # Pinning again follows it.
    assert command(project, ["pin", "imported", "--yes", *flags])[0] == 0
    assert f"revision: {'e' * 40}" in recipe.read_text() and recipe.read_text().count("track: main") == 1


def test_credentials_come_from_a_vault_file_and_are_never_printed(project: Path, remote: tuple[Remote, str]) -> None:
    state, url = remote
    publish(state)
    state.auth, state.gated = True, True
    (project / "recipes").mkdir()
    (project / "recipes" / "imported.yml").write_text(RECIPE)
    plain = (f"sparkserve_registry_credentials:\n  registry.example:5000:\n    username: {USER}\n"
             f"    password: {PASSWORD}\nweights_hf_token: {HUB_TOKEN}\n")
    vault = VaultLib([(DEFAULT_VAULT_ID_MATCH, VaultSecret(b"vault-pass"))])
    (project / "vault.yml").write_bytes(vault.encrypt(plain))
    flags = ["--registry", f"registry.example:5000={url}", "--hub-endpoint", url, "--credentials", "vault.yml"]
    code, out, err = command(project, ["pin", "imported", "--yes", *flags])
    assert code == 0, err
    assert PASSWORD not in out + err and HUB_TOKEN not in out + err
    (project / "wrong.yml").write_bytes(VaultLib([(DEFAULT_VAULT_ID_MATCH, VaultSecret(b"other"))]).encrypt(plain))
    code, _, err = command(project, ["pin", "imported", "--credentials", "wrong.yml", *flags[:4]])
    assert code == 2 and "does not open it" in err


def test_a_refusal_names_the_file_and_the_field(project: Path, remote: tuple[Remote, str]) -> None:
    state, url = remote
    (project / "recipes").mkdir()
    (project / "recipes" / "imported.yml").write_text(RECIPE)
    code, out, err = command(project, ["pin", "imported", "--registry", f"registry.example:5000={url}",
                                       "--hub-endpoint", url])
    assert code == 1 and out == ""
    assert err == (f"sparkserve recipe pin: {project / 'recipes' / 'imported.yml'}: the registry registry.example:5000 "
                   "has no tag 25.11 of registry.example:5000/team/vllm (recipe field image); check the name and the "
                   "tag\n")


def test_an_unknown_recipe_is_a_usage_error(project: Path) -> None:
    code, _, err = command(project, ["pin", "nothing-here"])
    assert code == 2 and "no recipe nothing-here" in err
