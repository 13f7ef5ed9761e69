"""Real readiness of the deployment's API on the head, as the supervisor probes it (requests: ..api)."""

from __future__ import annotations

import json
from typing import Callable

from ..api import answer_text, completion_choices, completion_payload, model_ids
from ..process import one_line
from .render import Render

DETAIL_CHARS = 200
HANG = "completions time out while /health answers (hang)"

# An HTTP request: (method, url, JSON body or None, timeout) -> (status, body). An HTTP error status is an
# answer; no answer in time raises TimeoutError, any other failure to get an answer another OSError
# (api.http_request, or the tests' engine).
Http = Callable[[str, str, "str | None", float], "tuple[int, str]"]


def no_answer(err: OSError, timeout: float) -> str:
    if isinstance(err, TimeoutError):
        return f"no answer in {timeout:g} s"
    if isinstance(err, ConnectionRefusedError):
        return "connection refused"
    return one_line(str(err), DETAIL_CHARS) or type(err).__name__


def ask(http: Http, method: str, url: str, path: str, body: str | None, timeout: float,
        raise_timeout: bool = False) -> tuple[int, str] | str:
    """One request of the probe: its status and body when it answered 200, else what went wrong.

    With raise_timeout, a timeout is raised (TimeoutError) for the caller to tell a hang from a failure.
    """
    try:
        status, text = http(method, url + path, body, timeout)
    except TimeoutError as err:
        if raise_timeout:
            raise
        return f"{method} {path}: {no_answer(err, timeout)}"
    except OSError as err:
        return f"{method} {path}: {no_answer(err, timeout)}"
    return (status, text) if status == 200 else answer_text(f"{method} {path}", status, text, DETAIL_CHARS)


def probe(api_base: str, render: Render, http: Http, timeout: float) -> str:
    """The three requests of real readiness; the cause of the first that fails, empty when all pass."""
    def fail(detail: str) -> str:
        return f"the head does not answer: {detail}"

    health = ask(http, "GET", api_base, render.health_path, None, timeout)
    if isinstance(health, str):
        return fail(health)
    if render.dead_pattern is not None and render.dead_pattern.search(health[1]):
        return fail(f"GET {render.health_path}: 200 but the engine says it is dead: "
                    f"{one_line(health[1], DETAIL_CHARS)}")
    models = ask(http, "GET", api_base, render.models_path, None, timeout)
    if isinstance(models, str):
        return fail(models)
    ids = model_ids(models[1])
    if ids is None or render.served_name not in ids:
        return fail(f"GET {render.models_path}: 200 but it does not list {render.served_name}: "
                    f"{one_line(models[1], DETAIL_CHARS)}")
    payload = json.dumps(completion_payload(render.served_name, render.canary_prompt))
    try:
        answer = ask(http, "POST", api_base, render.completions_path, payload, timeout, raise_timeout=True)
    except TimeoutError:  # health answered: a hang
        return HANG
    if isinstance(answer, str):
        return fail(answer)
    choices = completion_choices(answer[1])
    if choices is None or len(choices) != 1:
        return fail(f"POST {render.completions_path}: 200 but not one choice: {one_line(answer[1], DETAIL_CHARS)}")
    return ""
