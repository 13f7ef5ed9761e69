"""The gateway's settings, checked on the controller, and the files its nginx reads.

The gateway is Debian's nginx with its JavaScript module (njs): nginx listens, limits each key's request
rate, proxies to the engines without buffering (server-sent events pass as they come) and turns an engine
that does not answer into a 503; ``gateway.js`` (the role's static file) reads the key and the body's
``model`` and picks the deployment. What differs per inventory is rendered here, as two files that sit
beside ``gateway.js`` in one folder (nginx resolves their relative names there, so the same files are
checked with ``nginx -t`` in a staging folder before they replace the served ones):

- ``nginx.conf``: listen address and TLS, the body and time limits, one upstream and one named location
  per deployment, one request-rate zone per key that has a rate;
- ``routes.js``: which deployment serves each model name, and each key by its SHA-256 (never the key)
  with the models it may use.

Keys are hashed here; neither file, nor any message of this module, holds a key.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

# Names that go into nginx's configuration and the logs as they are.
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$")
_MODEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,199}$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_RATE = re.compile(r"^\s*(\d+)\s*(?:r|requests?)?\s*/\s*(s|sec|second|m|min|minute)\s*$")
JS_MODULE = "/usr/lib/nginx/modules/ngx_http_js_module.so"
# /health answers with the digest of the configuration it serves (render, served_digest): a run that changed
# the configuration asks it to know the change is live (nginx keeps serving the old one when a reload fails,
# as when it cannot bind a changed listen address).
CONFIG_HEADER = "X-Sparkserve-Config"
_DIGEST_LINE = re.compile(r"add_header %s ([0-9a-f]+) always;" % CONFIG_HEADER)
_LISTEN_LINE = re.compile(r"^ *(listen .*;)$", re.MULTILINE)
# Files of the gateway's folder, by role.
CONFIG_FILE = "nginx.conf"
ROUTES_FILE = "routes.js"
SCRIPT_FILE = "gateway.js"
TLS_CERTIFICATE_FILE = "tls.crt"
TLS_KEY_FILE = "tls.key"


class GatewayError(ValueError):
    """The settings cannot make a gateway; ``problems`` lists each, one sentence each."""

    def __init__(self, problems: Sequence[str]) -> None:
        super().__init__(" ".join(problems))
        self.problems = list(problems)


@dataclass(frozen=True)
class Route:
    """One deployment behind the gateway: the names it answers to and where its API listens."""

    deployment: str
    models: tuple[str, ...]
    host: str
    port: int


@dataclass(frozen=True)
class Key:
    """One API key, by name: its hash, the models it may use (None: all) and its request rate."""

    name: str
    sha256: str
    models: tuple[str, ...] | None
    per_second: float | None = None
    burst: int = 0
    rate_text: str = ""

    @property
    def retry_after_s(self) -> int:
        """Seconds until the rate lets one more request in."""
        return max(1, math.ceil(1.0 / self.per_second)) if self.per_second else 1


@dataclass(frozen=True)
class Paths:
    """Where the gateway keeps its state on its node (tests give temporary folders)."""

    log_dir: str
    state_dir: str
    pid_file: str
    user: str | None = "www-data"


@dataclass
class Gateway:
    """Everything the two rendered files say."""

    routes: list[Route]
    keys: list[Key]
    listen: str
    port: int
    tls: bool
    timeout_s: int
    max_body_mib: int
    retry_after_s: int
    paths: Paths

    @property
    def open(self) -> bool:
        """No key is set: the gateway asks for none, and listens on loopback only."""
        return not self.keys

    @property
    def listen_address(self) -> str:
        return "127.0.0.1" if self.open else self.listen


def parse_rate(text: str) -> tuple[float, int]:
    """(requests per second, requests per unit) of a rate such as ``60/m`` or ``5/s``; ValueError if not one."""
    match = _RATE.match(str(text))
    if not match or int(match.group(1)) < 1:
        raise ValueError(text)
    count = int(match.group(1))
    return (count if match.group(2).startswith("s") else count / 60.0), count


def _key(entry: Any, index: int, models: set[str], problems: list[str]) -> Key | None:
    where = "gateway_keys[%d]" % index
    if not isinstance(entry, Mapping):
        problems.append("%s is not a mapping; give name, key (or key_sha256), models and rate." % where)
        return None
    name = str(entry.get("name") or "")
    if not _NAME.match(name):
        problems.append("%s: name %r is not a name of letters, digits and . _ @ - (at most 64); the logs carry "
                        "it in place of the key." % (where, name))
        return None
    where = "gateway_keys %s" % name
    unknown = sorted(set(entry) - {"name", "key", "key_sha256", "models", "rate", "burst"})
    if unknown:
        problems.append("%s: unknown field%s %s; a key has name, key or key_sha256, models, rate and burst."
                        % (where, "s" if len(unknown) > 1 else "", ", ".join(unknown)))
    secret, digest = entry.get("key"), entry.get("key_sha256")
    if bool(secret) == bool(digest):
        problems.append("%s: give either key (kept in Ansible Vault) or key_sha256 (its SHA-256, hex), not %s."
                        % (where, "both" if secret else "neither"))
        return None
    if secret:
        secret = str(secret)
        if len(secret) < 16 or any(c.isspace() for c in secret):
            problems.append("%s: the key is shorter than 16 characters or holds a space; make one with "
                            "openssl rand -hex 24." % where)
            return None
        digest = hashlib.sha256(secret.encode()).hexdigest()
    digest = str(digest).lower()
    if not _SHA256.match(digest):
        problems.append("%s: key_sha256 is not 64 hex digits (printf %%s KEY | sha256sum)." % where)
        return None
    allowed = entry.get("models")
    if allowed is not None:
        if isinstance(allowed, str) or not isinstance(allowed, Sequence):
            problems.append("%s: models is a list of model names (leave it out for all)." % where)
            return None
        allowed = tuple(str(model) for model in allowed)
        missing = [model for model in allowed if model not in models]
        if missing:
            problems.append("%s: models %s %s served by no deployment; served: %s."
                            % (where, ", ".join(missing), "is" if len(missing) == 1 else "are",
                               ", ".join(sorted(models)) or "none"))
    per_second, burst, rate_text = None, 0, ""
    if entry.get("rate") not in (None, ""):
        try:
            per_second, burst = parse_rate(str(entry["rate"]))
        except ValueError:
            problems.append("%s: rate %r is not a request rate such as 60/m or 5/s." % (where, entry["rate"]))
            return None
        rate_text = ("%dr/s" % per_second) if per_second >= 1 and per_second == int(per_second) \
            else "%dr/m" % round(per_second * 60)
        if entry.get("burst") is not None:
            burst = int(entry["burst"])
            if burst < 0:
                problems.append("%s: burst is a count of requests, 0 or more." % where)
    return Key(name=name, sha256=digest, models=allowed, per_second=per_second, burst=burst, rate_text=rate_text)


def build(deployments: Sequence[Mapping[str, Any]], keys: Sequence[Any], *, listen: str, port: int,
          tls: bool, timeout_s: int, max_body_mib: int, retry_after_s: int, paths: Paths) -> Gateway:
    """The gateway these settings describe; GatewayError with every problem at once.

    ``deployments``: each ``{deployment, models, host, port}``, the API's address as the engine binds it.
    """
    problems: list[str] = []
    routes: list[Route] = []
    served: dict[str, str] = {}
    for entry in deployments:
        names = tuple(dict.fromkeys(str(model) for model in entry.get("models") or ()))
        deployment = str(entry.get("deployment"))
        for model in names:
            if not _MODEL.match(model):
                problems.append("deployment %s: model name %r cannot be routed; use letters, digits and . _ : / @ + -."
                                % (deployment, model))
            elif model in served:
                problems.append("model %s is served by two deployments, %s and %s; the gateway routes by model "
                                "name: give one of them another served name." % (model, served[model], deployment))
            else:
                served[model] = deployment
        routes.append(Route(deployment=deployment, models=names, host=str(entry["host"]), port=int(entry["port"])))
    checked: list[Key] = []
    for index, entry in enumerate(keys or ()):
        key = _key(entry, index, set(served), problems)
        if key is None:
            continue
        if key.models is not None:  # a deployment's names go together: its served name and its aliases
            key = replace(key, models=tuple(dict.fromkeys(
                name for route in routes if set(route.models) & set(key.models) for name in route.models)))
        if any(other.name == key.name for other in checked):
            problems.append("gateway_keys: the name %s is given twice; each key has its own name." % key.name)
        elif any(other.sha256 == key.sha256 for other in checked):
            problems.append("gateway_keys: %s is the same key as %s; give each its own."
                            % (key.name, next(o.name for o in checked if o.sha256 == key.sha256)))
        checked.append(key)
    if not 1 <= int(port) <= 65535:
        problems.append("gateway_port %s is not a TCP port." % port)
    if int(timeout_s) < 1 or int(max_body_mib) < 1 or int(retry_after_s) < 1:
        problems.append("gateway_timeout_s, gateway_max_body_mib and gateway_retry_after_s are 1 or more.")
    if problems:
        raise GatewayError(problems)
    return Gateway(routes=routes, keys=checked, listen=listen, port=int(port), tls=tls, timeout_s=int(timeout_s),
                   max_body_mib=int(max_body_mib), retry_after_s=int(retry_after_s), paths=paths)


def _bracket(address: str) -> str:
    return "[%s]" % address if ":" in address and not address.startswith("[") else address


def _error_body(kind: str, code: str, message: str) -> str:
    """An OpenAI error body, as a quoted nginx string (nginx variables in the message are expanded)."""
    body = json.dumps({"error": {"message": message, "type": kind, "param": None, "code": code}})
    return "'%s'" % body.replace("\\", "\\\\").replace("'", "\\'")


def render_routes(gateway: Gateway) -> str:
    """routes.js: the models, the deployments and the keys (by hash), for gateway.js."""
    data = {
        "open": gateway.open,
        "models": {model: index for index, route in enumerate(gateway.routes) for model in route.models},
        "deployments": [route.deployment for route in gateway.routes],
        "keys": {key.sha256: {"name": key.name, "models": list(key.models) if key.models is not None else None}
                 for key in gateway.keys},
    }
    return ("// Rendered by sparkserve (the gateway role): which deployment serves each model, and each API key\n"
            "// by its SHA-256 with the models it may use. gateway.js imports it.\n"
            "export default %s;\n" % json.dumps(data, indent=2, sort_keys=True))


def render_config(gateway: Gateway, digest: str = "") -> str:
    """nginx.conf: the gateway's whole nginx configuration; /health names digest (CONFIG_HEADER) when given."""
    paths = gateway.paths
    out: list[str] = [
        "# Rendered by sparkserve (the gateway role); checked with nginx -t before it replaces the one served.",
        "load_module %s;" % JS_MODULE,
    ]
    if paths.user:
        out.append("user %s;" % paths.user)
    out += [
        "worker_processes auto;",
        "pid %s;" % paths.pid_file,
        "error_log stderr warn;",
        "events { worker_connections 4096; }",
        "",
        "http {",
        "  server_tokens off;",
        "  default_type application/json;",
        "  js_import gateway from %s;" % SCRIPT_FILE,
        "  # The key's name (empty: no valid key) and the routed model: the access log's and the limits' keys.",
        "  js_set $gateway_key_name gateway.keyName;",
        "  js_var $gateway_model;",
        "  # Server-sent events pass as the engine writes them; a generation may run for timeout_s.",
        "  proxy_buffering off;",
        "  proxy_cache off;",
        "  proxy_http_version 1.1;",
        "  proxy_set_header Connection \"\";",
        "  proxy_set_header Authorization \"\";",
        "  proxy_connect_timeout 5s;",
        "  proxy_read_timeout %ds;" % gateway.timeout_s,
        "  proxy_send_timeout %ds;" % gateway.timeout_s,
        "  send_timeout %ds;" % gateway.timeout_s,
        "  # The whole body in memory, so that gateway.js reads the model after a long messages array.",
        "  client_max_body_size %dm;" % gateway.max_body_mib,
        "  client_body_buffer_size %dm;" % gateway.max_body_mib,
        "  subrequest_output_buffer_size 256k;",
        "  client_body_temp_path %s/body;" % paths.state_dir,
        "  proxy_temp_path %s/proxy;" % paths.state_dir,
        "  fastcgi_temp_path %s/fastcgi;" % paths.state_dir,
        "  uwsgi_temp_path %s/uwsgi;" % paths.state_dir,
        "  scgi_temp_path %s/scgi;" % paths.state_dir,
        "  # Each request by key name and model; never the key.",
        "  log_format gateway escape=json '{\"time\":\"$time_iso8601\",\"key\":\"$gateway_key_name\","
        "\"model\":\"$gateway_model\",\"method\":\"$request_method\",\"path\":\"$uri\",\"status\":$status,"
        "\"duration_s\":$request_time,\"ttfb_s\":\"$upstream_header_time\",\"bytes\":$bytes_sent}';",
        "  access_log %s/access.log gateway;" % paths.log_dir,
        "  limit_req_status 429;",
    ]
    limited = [key for key in gateway.keys if key.per_second]
    for index, key in enumerate(limited):
        out += [
            "  map $gateway_key_name $gateway_limit_%d { \"%s\" \"%s\"; default \"\"; }" % (index, key.name, key.name),
            "  limit_req_zone $gateway_limit_%d zone=gateway_key_%d:1m rate=%s;" % (index, index, key.rate_text),
        ]
    out.append("  map $gateway_key_name $gateway_retry_after {")
    out += ["    \"%s\" %d;" % (key.name, key.retry_after_s) for key in limited]
    out += ["    default 1;", "  }", ""]
    for index, route in enumerate(gateway.routes):
        out += [
            "  # deployment %s: %s" % (route.deployment, ", ".join(route.models)),
            "  upstream deployment_%d {" % index,
            "    server %s:%d max_fails=0;" % (_bracket(route.host), route.port),
            "    keepalive 32;",
            "  }",
        ]
    errors = [
        "    error_page 413 = @too_large;",
        "    error_page 429 = @rate_limited;",
        "    error_page 502 504 = @unavailable;",
    ]
    listen = "%s:%d" % (_bracket(gateway.listen_address), gateway.port)
    # "::" is every address: nginx's [::] would take IPv6 alone (and not 127.0.0.1, where the node asks).
    both_families = " ipv6only=off" if gateway.listen_address == "::" else ""
    out += [
        "",
        "  server {",
        "    listen %s%s%s;" % (listen, " ssl" if gateway.tls else "", both_families),
    ]
    if gateway.tls:
        out += [
            "    ssl_certificate %s;" % TLS_CERTIFICATE_FILE,
            "    ssl_certificate_key %s;" % TLS_KEY_FILE,
            "    ssl_protocols TLSv1.2 TLSv1.3;",
        ]
    out += ["    limit_req zone=gateway_key_%d%s;" % (index, " burst=%d nodelay" % key.burst if key.burst else "")
            for index, key in enumerate(limited)]
    out += errors
    out += [
        "    location = /health { access_log off;%s return 200 '{\"status\":\"ok\"}'; }"
        % (" add_header %s %s always;" % (CONFIG_HEADER, digest) if digest else ""),
        "    location = /v1/models { js_content gateway.models; }",
        "    location ~ ^/v1/(chat/completions|completions|embeddings)$ { js_content gateway.route; }",
        "    location / { js_content gateway.notFound; }",
    ]
    for index in range(len(gateway.routes)):
        out += [
            "    location @deployment_%d {" % index,
            "      proxy_pass http://deployment_%d;" % index,
            # An engine's own 503 (still loading, dead) gets the gateway's body and Retry-After too.
            "      proxy_intercept_errors on;",
            "      error_page 502 503 504 = @unavailable;",
            "    }",
            "    location = /_models/%d {" % index,
            "      internal;",
            "      proxy_connect_timeout 2s;",
            "      proxy_read_timeout 5s;",
            "      subrequest_output_buffer_size 256k;",
            # A subrequest carries its parent's body; a GET that came with one must not leave it on the
            # kept-alive connection, where the engine would read it as the next request.
            "      proxy_method GET;",
            "      proxy_pass_request_body off;",
            "      proxy_set_header Content-Length \"\";",
            "      proxy_pass http://deployment_%d/v1/models;" % index,
            "    }",
        ]
    retry = gateway.retry_after_s
    out += [
        "    location @too_large {",
        "      return 413 %s;" % _error_body("invalid_request_error", "request_too_large",
                                             "the request body is over %d MiB (gateway_max_body_mib)"
                                             % gateway.max_body_mib),
        "    }",
        "    location @rate_limited {",
        "      add_header Retry-After $gateway_retry_after always;",
        "      return 429 %s;" % _error_body("rate_limit_error", "rate_limit_exceeded",
                                             "key $gateway_key_name is over its request rate; retry in "
                                             "$gateway_retry_after s"),
        "    }",
        "    location @unavailable {",
        "      add_header Retry-After %d always;" % retry,
        "      return 503 %s;" % _error_body("service_unavailable", "model_unavailable",
                                             "model $gateway_model is not serving now (stopped, healing or "
                                             "being upgraded); retry in %d s" % retry),
        "    }",
        "  }",
        "}",
        "",
    ]
    return "\n".join(out)


def render(gateway: Gateway) -> dict[str, str]:
    """The rendered files by name. nginx.conf's /health names the digest of both files (the configuration
    without its own digest, and the routes), so that the configuration that serves can be told."""
    routes = render_routes(gateway)
    digest = hashlib.sha256((render_config(gateway) + routes).encode("utf-8")).hexdigest()[:16]
    return {CONFIG_FILE: render_config(gateway, digest), ROUTES_FILE: routes}


def served_digest(nginx_conf: str) -> str:
    """The digest a rendered nginx.conf's /health answers with (CONFIG_HEADER); empty when it names none."""
    found = _DIGEST_LINE.search(nginx_conf)
    return found.group(1) if found else ""


def listen_lines(nginx_conf: str) -> list[str]:
    """What a rendered nginx.conf listens on, its listen lines sorted; nginx binds a change of them only
    when it starts (a reload keeps the sockets it holds)."""
    return sorted(_LISTEN_LINE.findall(nginx_conf))
