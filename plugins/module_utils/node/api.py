"""The requests of real readiness to an OpenAI-compatible engine: engine_ready's probe and the supervisor's.

Readiness is three requests: the health path answers 200, the model list names the served model, and a
one-token completion answers with exactly one choice. This module sends a request and reads the answers;
what each caller makes of them (its waiting, its words) stays with it.
"""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.request
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .process import one_line

MAX_BODY = 64 * 1024
# The engine runs on the node that probes it: never send a probe through an http_proxy of the environment.
OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def http_request(method: str, url: str, body: Optional[str], timeout: float,
                 headers: Optional[Dict[str, str]] = None) -> Tuple[int, str]:
    """One request with a JSON body or none; its status and (up to MAX_BODY of) its body.

    An HTTP error status is an answer. No answer in time raises TimeoutError, a refused connection
    ConnectionRefusedError, any other failure to get an answer another OSError.
    """
    data = None if body is None else body.encode("utf-8")
    sent = {"Accept": "application/json", **(headers or {})}
    if data is not None:
        sent["Content-Type"] = "application/json"
    request = urllib.request.Request(url, data=data, headers=sent, method=method)
    try:
        with OPENER.open(request, timeout=timeout) as response:
            return int(response.status), response.read(MAX_BODY).decode("utf-8", "replace")
    except urllib.error.HTTPError as err:
        try:
            text = err.read(MAX_BODY).decode("utf-8", "replace")
        except (OSError, http.client.HTTPException):
            text = ""
        return err.code, text
    except urllib.error.URLError as err:
        if isinstance(err.reason, OSError):
            raise err.reason from err
        raise ConnectionError(str(err.reason)) from err
    except http.client.HTTPException as err:
        raise ConnectionError(f"{type(err).__name__}: {err}") from err


def head_api_base(api_host: str, api_port: int, wildcard_hosts: Sequence[str]) -> str:
    """``http://HOST:PORT`` as the head reaches an API bound to api_host: one bound to every interface (one of
    wildcard_hosts) at 127.0.0.1, any other address as it is (an IPv6 one in brackets)."""
    host = "127.0.0.1" if api_host in wildcard_hosts else api_host
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{int(api_port)}"


def answer_text(probe: str, status: int, body: str, limit: int) -> str:
    """``PROBE: STATUS REASON: BODY`` (the body on one line, cut to limit characters)."""
    text = f"{probe}: {status}"
    reason = http.client.responses.get(status, "")
    text += f" {reason}" if reason else ""
    shown = one_line(body, limit)
    return f"{text}: {shown}" if shown else text


def model_ids(body: str) -> Optional[List[str]]:
    """The ids of an OpenAI model list; None when the body is not one."""
    try:
        data = json.loads(body)["data"]
    except (ValueError, KeyError, TypeError):
        return None
    if not isinstance(data, list):
        return None
    return [str(item["id"]) for item in data if isinstance(item, dict) and "id" in item]


def completion_choices(body: str) -> Optional[List[Any]]:
    """The choices of an OpenAI completion; None when the body is not one."""
    try:
        choices = json.loads(body)["choices"]
    except (ValueError, KeyError, TypeError):
        return None
    return choices if isinstance(choices, list) else None


def completion_payload(model: str, prompt: str) -> Dict[str, Any]:
    """The one-token completion of the probe."""
    return {"model": model, "prompt": prompt, "max_tokens": 1}
