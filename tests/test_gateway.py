"""The gateway: the files the role renders (routes, keys, limits, TLS), and a real nginx serving them on
loopback in front of two engine doubles (every error class with its OpenAI body, routing by a model that
comes after 1 MB of messages, streaming without buffering, a reload during a stream, no key in any log)."""

from __future__ import annotations

import hashlib
import http.client
import json
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from ansible_collections.sparkserve.deploy.plugins.module_utils.gateway import config
from tests import gateway_live
from tests.gateway_live import Engine, Gateway, free_port

ALICE = "alice-key-0123456789abcdef"
BOB = "bob-key-0123456789abcdef01"
CAROL = "carol-key-0123456789abcdef"
DAVE = "dave-key-0123456789abcdef00"
ERIN = "erin-key-0123456789abcdef00"
PATHS = config.Paths(log_dir="/var/log/g", state_dir="/var/lib/g", pid_file="/run/g.pid")


def _build(keys: Any = (), **settings: Any) -> config.Gateway:
    options: dict[str, Any] = dict(listen="0.0.0.0", port=4000, tls=False, timeout_s=3600, max_body_mib=64,
                                   retry_after_s=10, paths=PATHS)
    options.update(settings)
    routes = [{"deployment": "big", "models": ["glm", "glm-alias"], "host": "127.0.0.1", "port": 8000},
              {"deployment": "coder", "models": ["qwen-coder"], "host": "10.0.0.2", "port": 8001}]
    return config.build(routes, list(keys), **options)


def _routes(gateway: config.Gateway) -> Any:
    text = config.render_routes(gateway)
    return json.loads(text.split("export default ", 1)[1].rstrip().rstrip(";"))


# The rendered files


def test_keys_are_hashed_and_never_rendered() -> None:
    bob = {"name": "bob", "key_sha256": hashlib.sha256(BOB.encode()).hexdigest(), "models": ["qwen-coder"]}
    gateway = _build([{"name": "alice", "key": ALICE}, bob])
    files = config.render(gateway)
    assert all(ALICE not in text and BOB not in text for text in files.values())
    keys = _routes(gateway)["keys"]
    assert keys[hashlib.sha256(ALICE.encode()).hexdigest()] == {"name": "alice", "models": None}
    assert keys[hashlib.sha256(BOB.encode()).hexdigest()] == {"name": "bob", "models": ["qwen-coder"]}


def test_routes_name_every_model_of_every_deployment() -> None:
    routes = _routes(_build([{"name": "alice", "key": ALICE}]))
    assert routes["models"] == {"glm": 0, "glm-alias": 0, "qwen-coder": 1}
    assert routes["deployments"] == ["big", "coder"]
    text = config.render_config(_build([{"name": "alice", "key": ALICE}]))
    assert "server 127.0.0.1:8000 max_fails=0;" in text and "server 10.0.0.2:8001 max_fails=0;" in text
    assert "location @deployment_1 {" in text and "proxy_pass http://deployment_1/v1/models;" in text


def test_a_key_given_one_name_of_a_deployment_may_use_all_its_names() -> None:
    keys = _routes(_build([{"name": "bob", "key": BOB, "models": ["glm-alias"]}]))["keys"]
    assert keys[hashlib.sha256(BOB.encode()).hexdigest()]["models"] == ["glm", "glm-alias"]


def test_no_key_means_open_on_loopback_only() -> None:
    gateway = _build([])
    assert gateway.open and "listen 127.0.0.1:4000;" in config.render_config(gateway)
    assert _routes(gateway)["open"] is True
    keyed = _build([{"name": "alice", "key": ALICE}])
    assert "listen 0.0.0.0:4000;" in config.render_config(keyed) and _routes(keyed)["open"] is False


def test_the_ipv6_wildcard_listens_on_both_families() -> None:
    text = config.render_config(_build([{"name": "alice", "key": ALICE}], listen="::"))
    assert "listen [::]:4000 ipv6only=off;" in text
    text = config.render_config(_build([{"name": "alice", "key": ALICE}], listen="fd00::1", tls=True))
    assert "listen [fd00::1]:4000 ssl;" in text


def test_health_names_the_digest_of_both_files_which_any_change_changes() -> None:
    files = config.render(_build([{"name": "alice", "key": ALICE}]))
    digest = config.served_digest(files[config.CONFIG_FILE])
    assert len(digest) == 16 and int(digest, 16) >= 0
    [health] = [line for line in files[config.CONFIG_FILE].splitlines() if "location = /health" in line]
    assert f"add_header X-Sparkserve-Config {digest} always;" in health
    assert config.render(_build([{"name": "alice", "key": ALICE}])) == files  # the same settings, the same files
    other_key = config.render(_build([{"name": "alice", "key": BOB}]))  # routes.js alone differs
    assert other_key[config.CONFIG_FILE].replace(config.served_digest(other_key[config.CONFIG_FILE]), digest) \
        == files[config.CONFIG_FILE]
    longer = config.render(_build([{"name": "alice", "key": ALICE}], timeout_s=60))  # nginx.conf differs
    assert len({digest, config.served_digest(other_key[config.CONFIG_FILE]),
                config.served_digest(longer[config.CONFIG_FILE])}) == 3
    assert config.served_digest(config.render_config(_build([]))) == ""  # rendered without one


def test_rates_become_one_zone_per_key_with_its_retry_after() -> None:
    text = config.render_config(_build([{"name": "alice", "key": ALICE, "rate": "30/m"},
                                        {"name": "bob", "key": BOB, "rate": "5/s", "burst": 2},
                                        {"name": "carol", "key": CAROL}]))
    assert "limit_req_zone $gateway_limit_0 zone=gateway_key_0:1m rate=30r/m;" in text
    assert "limit_req zone=gateway_key_0 burst=30 nodelay;" in text
    assert "limit_req_zone $gateway_limit_1 zone=gateway_key_1:1m rate=5r/s;" in text
    assert "limit_req zone=gateway_key_1 burst=2 nodelay;" in text
    assert '"alice" 2;' in text and '"bob" 1;' in text and "gateway_key_2" not in text


def test_tls_on_and_off() -> None:
    assert "ssl" not in config.render_config(_build([{"name": "alice", "key": ALICE}]))
    text = config.render_config(_build([{"name": "alice", "key": ALICE}], tls=True))
    assert "listen 0.0.0.0:4000 ssl;" in text
    assert "ssl_certificate tls.crt;" in text and "ssl_certificate_key tls.key;" in text


def test_limits_follow_the_settings() -> None:
    text = config.render_config(_build([{"name": "alice", "key": ALICE}], timeout_s=7200, max_body_mib=32))
    for line in ("proxy_read_timeout 7200s;", "client_max_body_size 32m;", "client_body_buffer_size 32m;",
                 "proxy_buffering off;", 'proxy_set_header Authorization "";'):
        assert line in text


@pytest.mark.parametrize(("keys", "expected"), [
    ([{"name": "alice"}], "give either key"),
    ([{"name": "alice", "key": ALICE, "key_sha256": "0" * 64}], "not both"),
    ([{"name": "alice", "key": "short"}], "shorter than 16"),
    ([{"name": "al ice", "key": ALICE}], "is not a name"),
    ([{"name": "alice", "key": ALICE, "models": ["nope"]}], "models nope is served by no deployment"),
    ([{"name": "alice", "key": ALICE, "rate": "fast"}], "is not a request rate"),
    ([{"name": "alice", "key": ALICE}, {"name": "alice", "key": BOB}], "given twice"),
    ([{"name": "alice", "key": ALICE}, {"name": "bob", "key": ALICE}], "the same key as alice"),
    ([{"name": "alice", "key": ALICE, "modles": ["glm"]}], "unknown field modles"),
])
def test_bad_keys_are_refused_without_the_key(keys: Any, expected: str) -> None:
    with pytest.raises(config.GatewayError) as raised:
        _build(keys)
    assert expected in str(raised.value)
    assert ALICE not in str(raised.value) and BOB not in str(raised.value)


def test_a_model_served_twice_is_refused() -> None:
    with pytest.raises(config.GatewayError, match="model glm is served by two deployments, a and b"):
        config.build([{"deployment": "a", "models": ["glm"], "host": "127.0.0.1", "port": 1},
                      {"deployment": "b", "models": ["glm"], "host": "127.0.0.1", "port": 2}], [],
                     listen="0.0.0.0", port=4000, tls=False, timeout_s=1, max_body_mib=1, retry_after_s=1, paths=PATHS)


def test_rates_parse() -> None:
    assert config.parse_rate("60/m") == (1.0, 60)
    assert config.parse_rate("5 r/s") == (5, 5)
    with pytest.raises(ValueError):
        config.parse_rate("0/m")


# A real nginx


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Gateway, Engine, Engine]]:
    big, coder = Engine(["glm", "glm-alias"]).start(), Engine(["qwen-coder"]).start()
    gateway = Gateway(tmp_path_factory.mktemp("gateway"), free_port())
    gateway.write([{"deployment": "big", "models": ["glm", "glm-alias"], "host": "127.0.0.1", "port": big.port},
                   {"deployment": "coder", "models": ["qwen-coder"], "host": "127.0.0.1", "port": coder.port}],
                  [{"name": "alice", "key": ALICE},
                   {"name": "bob", "key": BOB, "models": ["qwen-coder"]},
                   {"name": "erin", "key": ERIN, "rate": "1/m", "burst": 0},
                   {"name": "dave", "key": DAVE, "models": ["glm", "glm-alias"]}])
    gateway.start()
    yield gateway, big, coder
    gateway.stop()
    big.stop()
    coder.stop()


def _error(answer: tuple[int, dict[str, str], Any]) -> dict[str, Any]:
    status, headers, body = answer
    assert headers["content-type"].startswith("application/json"), headers
    assert set(body) == {"error"} and {"message", "type", "param", "code"} <= set(body["error"]), body
    return dict(body["error"], status=status, retry_after=headers.get("retry-after"))


def test_health_needs_no_key(live: tuple[Gateway, Engine, Engine]) -> None:
    assert live[0].request("GET", "/health")[:1] == (200,)


def test_401_without_a_key_or_with_a_wrong_one(live: tuple[Gateway, Engine, Engine]) -> None:
    gateway = live[0]
    for key in (None, "wrong-key-0123456789"):
        for method, path, body in (("GET", "/v1/models", None), ("POST", "/v1/chat/completions", {"model": "glm"}),
                                   ("GET", "/v1/anything", None)):
            error = _error(gateway.request(method, path, body, key=key))
            assert (error["status"], error["code"]) == (401, "invalid_api_key")


def test_models_lists_what_the_key_may_use(live: tuple[Gateway, Engine, Engine]) -> None:
    gateway = live[0]
    status, _, body = gateway.request("GET", "/v1/models", key=ALICE)
    assert status == 200 and [m["id"] for m in body["data"]] == ["glm", "glm-alias", "qwen-coder"]
    assert [m["id"] for m in gateway.request("GET", "/v1/models", key=DAVE)[2]["data"]] == ["glm", "glm-alias"]


def test_models_asked_with_a_body_leave_nothing_for_the_next(live: tuple[Gateway, Engine, Engine]) -> None:
    gateway = live[0]
    for _ in range(3):  # a GET with a body (some clients send "null"), then others on the same upstream connections
        status, _, body = gateway.request("GET", "/v1/models", key=ALICE, raw=b'{"pad": "' + b"x" * 64 + b'"}')
        assert status == 200 and [m["id"] for m in body["data"]] == ["glm", "glm-alias", "qwen-coder"], body


def test_403_for_a_model_the_key_may_not_use(live: tuple[Gateway, Engine, Engine]) -> None:
    error = _error(live[0].request("POST", "/v1/completions", {"prompt": "x", "model": "glm"}, key=BOB))
    assert (error["status"], error["code"]) == (403, "model_not_allowed")
    assert "may use: qwen-coder" in error["message"]


def test_404_for_an_unknown_model_names_the_served_ones(live: tuple[Gateway, Engine, Engine]) -> None:
    error = _error(live[0].request("POST", "/v1/completions", {"prompt": "x", "model": "gpt-4"}, key=ALICE))
    assert (error["status"], error["code"]) == (404, "model_not_found")
    assert '"gpt-4"' in error["message"] and "served: glm, glm-alias, qwen-coder" in error["message"]


def test_400_for_a_body_without_a_model(live: tuple[Gateway, Engine, Engine]) -> None:
    assert _error(live[0].request("POST", "/v1/completions", raw=b"{not json", key=ALICE))["status"] == 400
    assert _error(live[0].request("POST", "/v1/completions", {"prompt": "x"}, key=ALICE))["code"] == "model_missing"


def test_a_model_after_1_mib_of_messages_is_routed_and_the_key_stays_here(
        live: tuple[Gateway, Engine, Engine]) -> None:
    gateway, big, coder = live
    body = {"messages": [{"role": "user", "content": "x" * (1 << 20)}], "model": "qwen-coder"}
    status, _, answer = gateway.request("POST", "/v1/chat/completions", body, key=ALICE)
    assert status == 200 and answer["model"] == "qwen-coder"
    assert coder.seen[-1]["path"] == "/v1/chat/completions" and coder.seen[-1]["bytes"] > (1 << 20)
    assert coder.seen[-1]["authorization"] is None
    status, _, answer = gateway.request("POST", "/v1/completions", {"prompt": "x", "model": "glm-alias"}, key=ALICE)
    assert status == 200 and big.seen[-1]["model"] == "glm-alias"


def test_413_over_the_body_limit(live: tuple[Gateway, Engine, Engine]) -> None:
    body = {"messages": [{"role": "user", "content": "x" * (9 << 20)}], "model": "glm"}
    error = _error(live[0].request("POST", "/v1/chat/completions", body, key=ALICE))
    assert (error["status"], error["code"]) == (413, "request_too_large")


def test_429_over_the_rate_with_retry_after(live: tuple[Gateway, Engine, Engine]) -> None:
    gateway = live[0]
    # erin (1/m) is used by this test alone: its first request passes, the second is over the rate.
    answers = [gateway.request("POST", "/v1/completions", {"prompt": "x", "model": "qwen-coder"}, key=ERIN)
               for _ in range(2)]
    assert answers[0][0] == 200
    error = _error(answers[1])
    assert (error["status"], error["code"], error["retry_after"]) == (429, "rate_limit_exceeded", "60")
    assert "key erin" in error["message"]
    # Another key is not limited by erin's rate.
    assert gateway.request("POST", "/v1/completions", {"prompt": "x", "model": "qwen-coder"}, key=ALICE)[0] == 200


def test_stream_passes_event_by_event(live: tuple[Gateway, Engine, Engine]) -> None:
    gateway, big, _ = live
    big.release.clear()
    lines = gateway.stream({"model": "glm", "messages": [{"role": "user", "content": "hi"}]}, ALICE)
    # The first event arrives while the engine still holds the rest: nothing is buffered on the way.
    first = next(lines)
    assert b"Par" in first
    big.release.set()
    rest = b"".join(lines)
    assert b"is" in rest and b"[DONE]" in rest


def test_503_with_retry_after_for_a_deployment_that_is_down_and_the_other_serves(tmp_path: Path) -> None:
    coder = Engine(["qwen-coder"]).start()
    gateway = Gateway(tmp_path, free_port())
    gateway.write([{"deployment": "big", "models": ["glm"], "host": "127.0.0.1", "port": free_port()},
                   {"deployment": "coder", "models": ["qwen-coder"], "host": "127.0.0.1", "port": coder.port}],
                  [{"name": "alice", "key": ALICE}])
    gateway.start()
    try:
        error = _error(gateway.request("POST", "/v1/chat/completions", {"messages": [], "model": "glm"}, key=ALICE))
        assert (error["status"], error["code"], error["retry_after"]) == (503, "model_unavailable", "7")
        assert "model glm is not serving now" in error["message"]
        assert gateway.request("POST", "/v1/completions", {"prompt": "x", "model": "qwen-coder"}, key=ALICE)[0] == 200
        # /v1/models lists only what serves now.
        assert [m["id"] for m in gateway.request("GET", "/v1/models", key=ALICE)[2]["data"]] == ["qwen-coder"]
    finally:
        gateway.stop()
        coder.stop()


@contextmanager
def serving_big(tmp_path: Path, loading: bool = False,
                **settings: Any) -> Iterator[tuple[Gateway, Engine, list[dict[str, Any]]]]:
    """nginx in front of one engine double (deployment big, model glm) with alice's key; the gateway, the engine
    and the deployments it was written with. Both are stopped after."""
    big = Engine(["glm"], loading=loading).start()
    gateway = Gateway(tmp_path, free_port())
    deployments = [{"deployment": "big", "models": ["glm"], "host": "127.0.0.1", "port": big.port}]
    gateway.write(deployments, [{"name": "alice", "key": ALICE}], **settings)
    try:
        gateway.start()
        yield gateway, big, deployments
    finally:
        gateway.stop()
        big.stop()


def test_an_engine_still_loading_is_the_gateways_503_with_retry_after(tmp_path: Path) -> None:
    with serving_big(tmp_path, loading=True) as (gateway, big, _):
        error = _error(gateway.request("POST", "/v1/completions", {"prompt": "x", "model": "glm"}, key=ALICE))
        assert (error["status"], error["code"], error["retry_after"]) == (503, "model_unavailable", "7")
        assert big.seen, "the request reached the engine, whose own 503 the gateway replaced"
        big.loading = False
        assert gateway.request("POST", "/v1/completions", {"prompt": "x", "model": "glm"}, key=ALICE)[0] == 200


def test_a_reload_during_a_stream_does_not_cut_it(tmp_path: Path) -> None:
    with serving_big(tmp_path) as (gateway, big, deployments):
        big.release.clear()
        lines = gateway.stream({"model": "glm", "messages": []}, ALICE)
        assert b"Par" in next(lines)
        # A new key, checked by nginx -t, then applied while the stream is open.
        gateway.write(deployments, [{"name": "alice", "key": ALICE}, {"name": "carol", "key": CAROL}])
        gateway.reload()  # returns once the new workers alone take connections
        assert gateway.request("GET", "/v1/models", key=CAROL)[0] == 200
        assert any("shutting down" in title for title in gateway.workers().values())  # the stream's old worker
        big.release.set()
        rest = b"".join(lines)
        assert b"[DONE]" in rest


def test_a_reload_that_widens_the_listen_address_leaves_the_old_configuration_a_restart_applies_it(
        tmp_path: Path) -> None:
    # Why the role restarts nginx when the addresses it listens on change, and asks /health which
    # configuration serves: the first key moves the gateway from loopback to every address.
    keys = [{"name": "alice", "key": ALICE}]
    with serving_big(tmp_path) as (gateway, _, deployments):
        loopback = config.served_digest((tmp_path / config.CONFIG_FILE).read_text())
        assert gateway.served_digest() == loopback
        gateway.write(deployments, keys, listen="0.0.0.0")
        everywhere = config.served_digest((tmp_path / config.CONFIG_FILE).read_text())
        assert everywhere != loopback
        gateway.reload(applies=False)  # nginx -t passes: it does not bind
        refused = "bind() to 0.0.0.0:%d failed (98: Address already in use)" % gateway.port
        deadline = time.monotonic() + 50
        while refused not in gateway.logs() and time.monotonic() < deadline:
            threading.Event().wait(0.05)
        assert refused in gateway.logs()
        assert gateway.served_digest() == loopback  # still the configuration before, answering as if all was well
        gateway.stop()
        gateway.start()
        assert gateway.served_digest() == everywhere


def test_with_the_owners_certificate_it_serves_https_alone(tmp_path: Path) -> None:
    # start() asks /health over HTTPS, the certificate checked against 127.0.0.1.
    with serving_big(tmp_path, tls=True) as (gateway, _, _):
        assert gateway.request("GET", "/v1/models")[0] == 401
        status, _, body = gateway.request("GET", "/v1/models", key=ALICE)
        assert status == 200 and [model["id"] for model in body["data"]] == ["glm"]
        status, _, body = gateway.request("POST", "/v1/completions", {"model": "glm", "prompt": "hi", "max_tokens": 2},
                                          key=ALICE)
        assert status == 200 and body["model"] == "glm"
        plain = http.client.HTTPConnection("127.0.0.1", gateway.port, timeout=30)
        plain.request("GET", "/health")
        assert plain.getresponse().status == 400  # nginx: plain HTTP sent to the HTTPS port
        plain.close()


def test_a_gateway_on_the_ipv6_wildcard_answers_on_both_loopbacks(tmp_path: Path) -> None:
    # gateway_listen "::" means every address: the role asks /health at 127.0.0.1, clients may come over either.
    with serving_big(tmp_path, listen="::") as (gateway, _, _):  # start() waits for 127.0.0.1 to answer /health
        connection = http.client.HTTPConnection("::1", gateway.port, timeout=30)
        connection.request("GET", "/v1/models")
        assert connection.getresponse().status == 401  # the same server, asking for a key
        connection.close()


def test_a_bad_config_fails_nginx_check_and_the_served_one_stays(tmp_path: Path) -> None:
    gateway = Gateway(tmp_path, free_port())
    gateway.write([{"deployment": "big", "models": ["glm"], "host": "127.0.0.1", "port": 1}], [])
    assert gateway.check().returncode == 0
    (tmp_path / config.ROUTES_FILE).write_text("export default {;\n")
    checked = gateway.check()
    assert checked.returncode != 0 and "routes.js" in checked.stderr


def test_no_key_in_any_log(live: tuple[Gateway, Engine, Engine]) -> None:
    gateway = live[0]
    gateway.request("GET", "/v1/models", key=ALICE)
    gateway.request("GET", "/v1/models", key=BOB)
    gateway.request("GET", "/v1/models", key="wrong-key-0123456789")
    logs = gateway.logs()
    assert '"key":"alice"' in logs and '"key":"bob"' in logs
    for secret in (ALICE, BOB, DAVE, ERIN, "wrong-key-0123456789"):
        assert secret not in logs
    for line in (gateway.folder / "log" / "access.log").read_text().splitlines():
        entry = json.loads(line)
        assert set(entry) == {"time", "key", "model", "method", "path", "status", "duration_s", "ttfb_s", "bytes"}


def test_nginx_and_its_js_module_are_there() -> None:
    # The live tests need Debian's nginx and libnginx-mod-http-js (tools/setup-controller.sh installs them).
    assert Path(config.JS_MODULE).is_file()
    assert subprocess.run([gateway_live.NGINX, "-v"], capture_output=True, check=False).returncode == 0
