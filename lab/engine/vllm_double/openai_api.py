"""OpenAI-compatible request checks and response bodies, shaped like vLLM's.

Prompt tokens are counted as whitespace-separated words: of the prompt for
``/v1/completions`` (a list of token ids counts one token per id), of every
message's text for ``/v1/chat/completions``.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

from .generation import count_tokens

COMPLETION_DEFAULT_MAX_TOKENS = 16  # vLLM's default for /v1/completions


class ApiError(Exception):
    """An error answer: HTTP status plus vLLM's error object."""

    def __init__(self, status: int, message: str, kind: str = "BadRequestError", param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind
        self.param = param

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.status}}


@dataclass(frozen=True)
class GenRequest:
    """A checked generation request."""

    chat: bool
    model: str
    prompt: str
    prompt_tokens: int
    max_tokens: int
    ignore_eos: bool
    temperature: float
    seed: int
    stream: bool
    include_usage: bool


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _completion_prompt(body: dict[str, Any]) -> tuple[str, int]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return prompt, count_tokens(prompt)
    if isinstance(prompt, list) and all(_is_int(item) for item in prompt):
        return " ".join(str(item) for item in prompt), len(prompt)
    raise ApiError(400, "prompt must be a string or a list of token ids (one prompt per request in the lab double)",
                   param="prompt")


def _message_text(message: Any) -> str:
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        raise ApiError(400, "each message needs a role and a content", param="messages")
    content = message.get("content")
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        return " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    raise ApiError(400, "message content must be a string or a list of parts", param="messages")


def _chat_prompt(body: dict[str, Any]) -> tuple[str, int]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "messages must be a non-empty list", param="messages")
    text = "\n".join(_message_text(message) for message in messages)
    return text, count_tokens(text)


def _max_tokens(body: dict[str, Any], chat: bool, prompt_tokens: int, max_model_len: int) -> int:
    value = body.get("max_completion_tokens") if chat else None
    if value is None:
        value = body.get("max_tokens")
    if value is None:
        return max_model_len - prompt_tokens if chat else COMPLETION_DEFAULT_MAX_TOKENS
    if not _is_int(value) or value < 1:
        raise ApiError(400, "max_tokens must be at least 1, got %r." % (value,), param="max_tokens")
    return value


def _number(body: dict[str, Any], key: str, default: float) -> float:
    value = body.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ApiError(400, "%s must be a number of at least 0, got %r." % (key, value), param=key)
    return float(value)


def _check_model(body: dict[str, Any], served_names: tuple[str, ...]) -> str:
    model = body.get("model")
    if model is None:
        return served_names[0]
    if model not in served_names:
        raise ApiError(404, "The model `%s` does not exist." % model, kind="NotFoundError", param="model")
    return str(model)


def parse_request(body: Any, chat: bool, served_names: tuple[str, ...], max_model_len: int,
                  default_seed: int) -> GenRequest:
    """Check a request body; raises ApiError as vLLM would answer it."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    model = _check_model(body, served_names)
    prompt, prompt_tokens = _chat_prompt(body) if chat else _completion_prompt(body)
    if prompt_tokens == 0:
        raise ApiError(400, "The decoder prompt cannot be empty", param="prompt")
    max_tokens = _max_tokens(body, chat, prompt_tokens, max_model_len)
    if prompt_tokens + max_tokens > max_model_len:
        raise ApiError(400, "This model's maximum context length is %d tokens. However, you requested %d tokens "
                       "(%d in the messages, %d in the completion). Please reduce the length of the messages or "
                       "completion." % (max_model_len, prompt_tokens + max_tokens, prompt_tokens, max_tokens),
                       param="max_tokens")
    seed = body.get("seed")
    if seed is not None and not _is_int(seed):
        raise ApiError(400, "seed must be an integer", param="seed")
    options = body.get("stream_options") or {}
    return GenRequest(
        chat=chat, model=model, prompt=prompt, prompt_tokens=prompt_tokens, max_tokens=max_tokens,
        ignore_eos=bool(body.get("ignore_eos", False)), temperature=_number(body, "temperature", 1.0),
        seed=default_seed if seed is None else seed, stream=bool(body.get("stream", False)),
        include_usage=bool(isinstance(options, dict) and options.get("include_usage")),
    )


def new_request_id(chat: bool) -> str:
    return ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + completion_tokens,
            "completion_tokens": completion_tokens}


def response_body(req: GenRequest, request_id: str, text: str, finish: str, completion_tokens: int) -> dict[str, Any]:
    """The non-streamed answer."""
    if req.chat:
        choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text, "tool_calls": []},
                                  "logprobs": None, "finish_reason": finish, "stop_reason": None}
        kind = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish, "stop_reason": None}
        kind = "text_completion"
    return {"id": request_id, "object": kind, "created": int(time.time()), "model": req.model,
            "choices": [choice], "usage": usage(req.prompt_tokens, completion_tokens)}


def chunk_body(req: GenRequest, request_id: str, text: str | None, finish: str | None,
               role: bool = False) -> dict[str, Any]:
    """One streamed chunk; for chat, ``role`` makes the opening chunk that names the assistant."""
    if req.chat:
        delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else {"content": text}
        choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        kind = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish, "stop_reason": None}
        kind = "text_completion"
    return {"id": request_id, "object": kind, "created": int(time.time()), "model": req.model, "choices": [choice]}


def usage_chunk(req: GenRequest, request_id: str, completion_tokens: int) -> dict[str, Any]:
    """The last chunk when stream_options.include_usage is set: no choices, the usage."""
    kind = "chat.completion.chunk" if req.chat else "text_completion"
    return {"id": request_id, "object": kind, "created": int(time.time()), "model": req.model, "choices": [],
            "usage": usage(req.prompt_tokens, completion_tokens)}


def models_body(served_names: tuple[str, ...], root: str, max_model_len: int, created: int,
                owned_by: str = "vllm") -> dict[str, Any]:
    """``GET /v1/models``."""
    data = [{"id": name, "object": "model", "created": created, "owned_by": owned_by, "root": root, "parent": None,
             "max_model_len": max_model_len, "permission": []} for name in served_names]
    return {"object": "list", "data": data}
