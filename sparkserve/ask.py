"""One real completion from the endpoint a run reported, to show that the deployment answers."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any

# The endpoint is the deployment's own; never send the request through a proxy of the environment.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class AskError(Exception):
    """The completion could not be had; the message says why."""


def complete(endpoint: Mapping[str, Any], prompt: str, max_tokens: int = 16, timeout_s: float = 60.0,
             key: str = "") -> str:
    """The text the deployment completes the prompt with (POST /v1/completions at the endpoint's URL, with the
    gateway's key when one is given)."""
    url = str(endpoint.get("url") or "").rstrip("/")
    model = str(endpoint.get("model_name") or "")
    if not url or not model:
        raise AskError("the run reported no endpoint to ask")
    if endpoint.get("loopback") in (True, "true", "True"):
        raise AskError(f"the API listens on the head's loopback; open the ssh tunnel shown above, then ask {url}")
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens}).encode()
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = "Bearer " + key
    request = urllib.request.Request(url + "/v1/completions", data=body, method="POST", headers=headers)
    try:
        with _OPENER.open(request, timeout=timeout_s) as answer:
            data = json.loads(answer.read().decode("utf-8", "replace"))
    except urllib.error.HTTPError as error:
        detail = error.read(300).decode("utf-8", "replace")
        raise AskError(f"{url}/v1/completions answered {error.code}: {detail}") from None
    except (urllib.error.URLError, OSError, ValueError) as error:
        raise AskError(f"{url}/v1/completions: {error}") from None
    choices = data.get("choices") if isinstance(data, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise AskError(f"{url}/v1/completions answered without a choice: {str(data)[:300]}")
    return str(choices[0].get("text", ""))
