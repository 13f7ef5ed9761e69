"""The lab's gateway as a client sees it, through the `openai` Python client.

Run by the fleet scenario (molecule/fleet) against the lab's gateway, with the
lab's three keys (.lab/gateway-key: every model; -first: the first
deployment's; -slow: one request a minute):

    python -m tests.gateway_openai --url http://NODE:4000 --keys .lab/gateway-key \\
        --models tiny-model,tiny-model-1,tiny-chat --first tiny-model --reload-command 'ssh NODE systemctl reload ...'

Each check prints one line; the first that fails ends the run with exit 1 and
what it saw. No key is ever printed.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx2 as httpx
import openai

MIB = 1 << 20


class CheckFailedError(Exception):
    """A check saw something else than it expects."""


def expect(condition: bool, what: str) -> None:
    if not condition:
        raise CheckFailedError(what)


def client(url: str, key: str, **options: Any) -> openai.OpenAI:
    # No retry: a 429 or 503 must reach the check, not be waited out by the client.
    return openai.OpenAI(base_url=url.rstrip("/") + "/v1", api_key=key, max_retries=0, timeout=120.0, **options)


def refused(call: Callable[[], Any], error: type[openai.APIStatusError], code: str) -> openai.APIStatusError:
    """The error ``call`` raises, of class ``error`` with OpenAI's error JSON whose code is ``code``."""
    try:
        call()
    except error as raised:
        body = raised.body if isinstance(raised.body, dict) else {}
        expect(body.get("code") == code, "%s: error code %r, not %r: %s" % (error.__name__, body.get("code"), code,
                                                                              raised.body))
        return raised
    raise CheckFailedError("%s expected, the request was answered" % error.__name__)


def model_ids(api: openai.OpenAI) -> list[str]:
    return sorted(model.id for model in api.models.list())


def check_keys(url: str, keys: dict[str, str], models: list[str], first: list[str]) -> None:
    refused(lambda: model_ids(client(url, "not-a-key-of-this-gateway")), openai.AuthenticationError, "invalid_api_key")
    plain = httpx.get(url.rstrip("/") + "/v1/models", timeout=30)
    expect(plain.status_code == 401 and plain.json()["error"]["code"] == "invalid_api_key",
           "no key: %s %s" % (plain.status_code, plain.text[:200]))
    print("ok   401 without a key and with a wrong one, in OpenAI's error JSON")
    listed = model_ids(client(url, keys["lab"]))
    if listed != sorted(models):
        again = client(url, keys["lab"]).models.with_raw_response.list().http_response
        raise CheckFailedError("/v1/models with the lab key lists %s, not %s; asked again: %s %s %s"
                               % (listed, sorted(models), again.status_code, dict(again.headers), again.text[:500]))
    listed = model_ids(client(url, keys["first"]))
    expect(listed == sorted(first), "/v1/models with the first key lists %s, not %s" % (listed, sorted(first)))
    print("ok   /v1/models per key: %s; %s" % (", ".join(sorted(models)), ", ".join(sorted(first))))
    other = next(model for model in models if model not in first)
    refused(lambda: client(url, keys["first"]).completions.create(model=other, prompt="Hi", max_tokens=1),
            openai.PermissionDeniedError, "model_not_allowed")
    print("ok   403 for %s with the key kept to %s" % (other, ", ".join(first)))
    error = refused(lambda: client(url, keys["lab"]).completions.create(model="gpt-4", prompt="Hi", max_tokens=1),
                    openai.NotFoundError, "model_not_found")
    expect(all(model in str(error.body) for model in models),
           "the 404 does not name every served model: %s" % error.body)
    print("ok   404 for an unknown model, naming the served ones")
    slow = client(url, keys["slow"])
    slow.completions.create(model=first[0], prompt="Hi", max_tokens=1)
    error = refused(lambda: slow.completions.create(model=first[0], prompt="Hi", max_tokens=1),
                    openai.RateLimitError, "rate_limit_exceeded")
    expect(int(error.response.headers.get("retry-after", "0")) > 0, "the 429 has no Retry-After")
    print("ok   429 with Retry-After %s s over the slow key's rate" % error.response.headers["retry-after"])


def check_models_serve(url: str, key: str, models: list[str]) -> None:
    api = client(url, key)
    for model in models:
        stream = api.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hello there"}],
                                             max_tokens=8, stream=True)
        chunks = list(stream)
        text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
        finish = [chunk.choices[0].finish_reason for chunk in chunks
                  if chunk.choices and chunk.choices[0].finish_reason]
        expect(len(chunks) >= 2 and bool(text) and bool(finish), "%s: a stream of %d chunks, text %r, finish %s"
               % (model, len(chunks), text, finish))
        done = api.completions.create(model=model, prompt="The capital of France is", max_tokens=4)
        expect(done.model == model and bool(done.choices[0].text), "%s: completion %s" % (model, done))
        print("ok   %s: a streamed chat of %d chunks and a completion" % (model, len(chunks)))


def check_long_request(url: str, key: str, model: str) -> None:
    """A chat whose `model` comes after 1 MiB of messages (as older openai clients and many others write it)
    reaches its deployment: the body is written by hand, in that order."""
    # One word of 1 MiB: the lab's engine counts words as tokens, so the body is long and the prompt short.
    body = json.dumps({"messages": [{"role": "user", "content": "x" * MIB}], "max_tokens": 2, "model": model})
    position = body.find('"model"')
    answer = httpx.post(url.rstrip("/") + "/v1/chat/completions", content=body.encode(), timeout=120,
                        headers={"Authorization": "Bearer " + key, "Content-Type": "application/json"})
    expect(answer.status_code == 200, "%s: %s" % (answer.status_code, answer.text[:300]))
    expect(answer.json().get("model") == model, "answered by %s, not %s" % (answer.json().get("model"), model))
    print("ok   %s: a %.1f MiB chat whose model comes after byte %d is routed to it"
          % (model, len(body) / MIB, position))


def check_reload_during_stream(url: str, key: str, model: str, reload_command: str) -> None:
    """A gateway reload while a long stream is in flight: the stream goes on to its end.

    The reload runs after the first event; the stream's last event must arrive at least a second after the
    reload returned (events the client had not read yet arrive at once), so the reload happened mid-stream."""
    # ignore_eos (vLLM's own field): all 2000 tokens are generated, several seconds of them in the lab.
    stream = client(url, key).completions.create(model=model, prompt="Once", max_tokens=2000, stream=True,
                                                 extra_body={"ignore_eos": True})
    reloaded = last = 0.0
    events = 0
    finish = None
    for chunk in stream:
        events += 1
        if not reloaded:
            subprocess.run(shlex.split(reload_command), check=True, capture_output=True, timeout=60)
            reloaded = time.monotonic()
        last = time.monotonic()
        finish = chunk.choices[0].finish_reason or finish
    expect(finish == "length", "the stream ended after %d events, finish %s" % (events, finish))
    expect(last - reloaded >= 1.0, "inconclusive: the stream's last event came %.2f s after the reload returned "
                                   "(the stream ended before the reload)" % (last - reloaded))
    print("ok   %s: a stream of %d events went on %.1f s past a reload of the gateway, to its end"
          % (model, events, last - reloaded))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True, help="the gateway, http://HOST:PORT")
    parser.add_argument("--keys", required=True, type=Path, help="the lab key's file; -first and -slow beside it")
    parser.add_argument("--models", required=True, help="every served name and alias, comma-separated")
    parser.add_argument("--first", required=True, help="the first deployment's names, comma-separated")
    parser.add_argument("--reload-command", required=True, help="a command that reloads the gateway")
    args = parser.parse_args(argv)
    keys = {name: Path(str(args.keys) + suffix).read_text().strip()
            for name, suffix in (("lab", ""), ("first", "-first"), ("slow", "-slow"))}
    models, first = args.models.split(","), args.first.split(",")
    other = next(model for model in models if model not in first)
    try:
        check_keys(args.url, keys, models, first)
        check_models_serve(args.url, keys["lab"], models)
        check_long_request(args.url, keys["lab"], other)
        check_reload_during_stream(args.url, keys["lab"], first[0], args.reload_command)
    except (CheckFailedError, openai.OpenAIError, httpx.HTTPError, subprocess.SubprocessError) as error:
        print("FAIL %s: %s" % (type(error).__name__, error))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
