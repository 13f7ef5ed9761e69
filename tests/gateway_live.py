"""A real gateway for the tests: Debian's nginx and its njs module, run on loopback with the files the role
renders, in front of engine doubles that answer the OpenAI routes on loopback."""

from __future__ import annotations

import datetime
import http.client
import ipaddress
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from ansible_collections.sparkserve.deploy.plugins.module_utils.gateway import config

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "roles" / "gateway" / "files" / config.SCRIPT_FILE
NGINX = shutil.which("nginx") or "/usr/sbin/nginx"


@dataclass
class Engine:
    """An engine double: its models, the requests it saw, and a gate that holds a stream after its first event;
    while ``loading``, it answers 503 with its own body, as an engine still loading its weights does."""

    models: Sequence[str]
    loading: bool = False
    seen: list[dict[str, Any]] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)
    server: ThreadingHTTPServer | None = None

    @property
    def port(self) -> int:
        assert self.server is not None
        return int(self.server.server_address[1])

    def start(self) -> Engine:
        engine = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _json(self, status: int, data: Any) -> None:
                body = json.dumps(data).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                if self.path == "/v1/models":
                    self._json(200, {"object": "list", "data": [{"id": m, "object": "model"} for m in engine.models]})
                else:
                    self._json(404, {"detail": "not found"})

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                request = json.loads(body)
                engine.seen.append({"path": self.path, "bytes": len(body), "model": request.get("model"),
                                    "authorization": self.headers.get("Authorization")})
                if engine.loading:
                    self._json(503, {"error": {"message": "The engine is still loading.", "code": 503}})
                    return
                if not request.get("stream"):
                    self._json(200, {"object": "text_completion", "model": request.get("model"),
                                     "choices": [{"index": 0, "text": " Paris"}]})
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()

                def event(data: str) -> None:
                    chunk = ("data: %s\n\n" % data).encode()
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    self.wfile.flush()

                event(json.dumps({"choices": [{"delta": {"content": "Par"}}]}))
                engine.release.wait(30)
                event(json.dumps({"choices": [{"delta": {"content": "is"}}]}))
                event("[DONE]")
                self.wfile.write(b"0\r\n\r\n")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


def self_signed(folder: Path) -> ssl.SSLContext:
    """An owner's certificate for 127.0.0.1 and its key, written where the role stages them (tls.crt, tls.key);
    a client context that trusts it alone and checks the name, as a client given the certificate would."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "sparkserve gateway test")])
    now = datetime.datetime.now(datetime.timezone.utc)
    certificate = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
                   .serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + datetime.timedelta(days=1))
                   .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                                  critical=False)
                   .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                   .sign(key, hashes.SHA256()))
    pem = certificate.public_bytes(serialization.Encoding.PEM)
    (folder / config.TLS_CERTIFICATE_FILE).write_bytes(pem)
    (folder / config.TLS_KEY_FILE).write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    (folder / config.TLS_KEY_FILE).chmod(0o600)
    return ssl.create_default_context(cadata=pem.decode())


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class Gateway:
    """nginx serving the rendered files from folder."""

    folder: Path
    port: int
    process: subprocess.Popen[bytes] | None = None
    # With tls=True written: the context of a client that trusts the gateway's certificate.
    tls: ssl.SSLContext | None = None

    def write(self, deployments: Sequence[Mapping[str, Any]], keys: Sequence[Mapping[str, Any]],
              **settings: Any) -> None:
        paths = config.Paths(log_dir=str(self.folder / "log"), state_dir=str(self.folder / "state"),
                             pid_file=str(self.folder / "nginx.pid"), user="root" if os.geteuid() == 0 else None)
        for sub in ("log", "state"):
            (self.folder / sub).mkdir(exist_ok=True)
        options = dict(listen="127.0.0.1", port=self.port, tls=False, timeout_s=60, max_body_mib=8,
                       retry_after_s=7, paths=paths)
        options.update(settings)
        gateway = config.build(deployments, keys, **options)
        self.tls = self_signed(self.folder) if gateway.tls else None
        for name, text in config.render(gateway).items():
            (self.folder / name).write_text(text)
        shutil.copy(SCRIPT, self.folder / config.SCRIPT_FILE)

    def check(self) -> subprocess.CompletedProcess[str]:
        return subprocess.run([NGINX, "-t", "-q", "-e", "stderr", "-c", str(self.folder / config.CONFIG_FILE)],
                              capture_output=True, text=True, check=False)

    def start(self) -> None:
        checked = self.check()
        assert checked.returncode == 0, checked.stderr
        # The configuration logs to stderr (as under systemd): kept beside the other logs, which logs() reads.
        with open(self.folder / "log" / "stderr.log", "ab") as stderr:
            self.process = subprocess.Popen([NGINX, "-e", str(self.folder / "log" / "error.log"), "-c",
                                             str(self.folder / config.CONFIG_FILE), "-g", "daemon off;"],
                                            stderr=stderr)
        deadline = time.monotonic() + 50  # a loaded machine can take seconds to start it
        while time.monotonic() < deadline:
            try:
                if self.request("GET", "/health")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise AssertionError("the gateway did not answer /health")

    def workers(self) -> dict[int, str]:
        """The nginx master's children, by pid, with their process titles."""
        assert self.process is not None
        found = {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                parent = int((Path("/proc") / entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                if parent == self.process.pid:
                    found[int(entry)] = (Path("/proc") / entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except (OSError, ValueError, IndexError):
                continue  # gone meanwhile
        return found

    def reload(self, applies: bool = True) -> None:
        """nginx -t, then HUP. Where the new configuration applies, wait until it alone takes connections:
        the old workers accept new ones until they take the master's signal to finish what they hold."""
        assert self.process is not None
        checked = self.check()
        assert checked.returncode == 0, checked.stderr
        old = self.workers()
        self.process.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 50
        while applies and time.monotonic() < deadline:
            now = self.workers()
            if set(now) - set(old) and all(pid not in now or "shutting down" in now[pid] for pid in old):
                return
            time.sleep(0.02)
        assert not applies, f"nginx did not hand over to new workers: before {old}, now {self.workers()}"

    def stop(self) -> None:
        if self.process is not None:
            self.process.send_signal(signal.SIGQUIT)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def connect(self) -> http.client.HTTPConnection:
        """A connection to the gateway on loopback: HTTPS, checking its certificate, when it has one."""
        if self.tls is not None:
            return http.client.HTTPSConnection("127.0.0.1", self.port, timeout=30, context=self.tls)
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)

    def request(self, method: str, path: str, body: Any = None, key: str | None = None,
                raw: bytes | None = None) -> tuple[int, dict[str, str], Any]:
        """(status, headers, decoded JSON body or text)."""
        connection = self.connect()
        headers = {"Content-Type": "application/json"}
        if key is not None:
            headers["Authorization"] = "Bearer " + key
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        connection.request(method, path, body=data, headers=headers)
        answer = connection.getresponse()
        text = answer.read().decode()
        connection.close()
        try:
            decoded: Any = json.loads(text)
        except ValueError:
            decoded = text
        return answer.status, {k.lower(): v for k, v in answer.getheaders()}, decoded

    def served_digest(self) -> str:
        """The digest of the configuration that answers /health (config.CONFIG_HEADER)."""
        return self.request("GET", "/health")[1].get(config.CONFIG_HEADER.lower(), "")

    def stream(self, body: Any, key: str) -> Iterator[bytes]:
        """The pieces of a streamed answer (chunked encoding undone), as they arrive."""
        connection = self.connect()
        connection.request("POST", "/v1/chat/completions", body=json.dumps(dict(body, stream=True)),
                           headers={"Content-Type": "application/json", "Authorization": "Bearer " + key})
        answer = connection.getresponse()
        assert answer.status == 200, answer.read()
        while piece := answer.read1(65536):
            yield piece
        connection.close()

    def logs(self) -> str:
        return "\n".join(p.read_text(errors="replace") for p in sorted((self.folder / "log").glob("*")))
