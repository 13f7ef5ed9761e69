"""A collected text (a log, a journal, a file, docker inspect's JSON) with every secret in it masked."""

from __future__ import annotations

import json
import re
from typing import Any, Iterable

from ansible_collections.sparkserve.deploy.plugins.module_utils.secrets import MASK, looks_secret, mask_argv

DOCUMENTATION = r"""
name: mask_text
short_description: Mask every secret in a collected text, for a diagnostic archive
version_added: "0.2.0"
positional: secrets
description:
  - >-
    For texts that leave the cluster (playbooks/diagnose.yml's archive). Replaces with C(********), wherever they
    appear, each of O(secrets) (as written and as escaped inside JSON), and the values the patterns below find.
  - >-
    The value of a secret-looking name (module_utils/secrets.py decides, as for the C(mask_secrets) filter;
    C(HF_TOKEN), C(OPENAI_API_KEY), C(api_key), C(DB_PASSWORD), not C(TOKENIZERS_PARALLELISM) or C(NCCL_IB_PKEY))
    given as C(NAME=VALUE) or C(NAME: VALUE), quoted or not; at the start of a line (an environment file, C(env),
    C(export)) the rest of the line is masked.
  - >-
    The word after a secret-looking flag, C(--api-key VALUE), C(--api-key=VALUE), and in a quoted list
    C("--api-key", "VALUE").
  - >-
    Hugging Face tokens (C(hf_) and 10 or more letters or digits), C(Bearer TOKEN), the value of an
    C(Authorization) header, and the password of C(scheme://user:password@host).
  - >-
    A text that is one JSON document (docker inspect, a recorded render) is read as JSON and written back with an
    indent of 4. Each of its strings is masked as above; each list of strings is read as a command line
    (C(Config.Cmd), C(Args)) and each C(NAME=VALUE) string as an environment entry (C(Config.Env)); under a
    secret-looking key every string is masked, and numbers and booleans are kept (C(eos_token_id)).
options:
  _input:
    description: The text. Anything else is turned into text first; V(null) is the empty text.
    type: raw
    required: true
  secrets:
    description: Literal values to mask wherever they appear (the Hugging Face token). Empty ones are ignored.
    type: list
    elements: str
    default: []
"""

EXAMPLES = r"""
saved: "{{ __journal.stdout | sparkserve.deploy.mask_text([weights_hf_token]) }}"
# "HF_TOKEN=hf_abcdefghijklmn --api-key sk-1" gives "HF_TOKEN=******** --api-key ********"
"""

RETURN = r"""
_value:
  description: The text with every secret replaced by C(********).
  type: str
"""

_NAME = r"[A-Za-z_][A-Za-z0-9_.-]*"
# A value: a quoted string, a bracketed list (vLLM logs its api_key as one) or a word.
_VALUE = re.compile(r""""(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*'|\[[^\]\n]*\]|[^\s"',;)}\]]+""")

# NAME=VALUE or NAME: VALUE at the start of a line (env files, `env`, `export`, YAML): the rest of the line.
_LINE = re.compile(
    r"(?m)^(?P<lead>[ \t]*(?:export[ \t]+)?)(?P<name>" + _NAME + r")(?P<sep>[ \t]*[=:][ \t]*)(?P<value>\S.*)$"
)
# What comes before a value anywhere in a line: NAME= or NAME: ("NAME": and 'NAME': too), --flag= , --flag
# followed by blanks, and "--flag", in a quoted list. Only the head is matched, so that the value of a plain
# name (systemd's Environment=HF_TOKEN=...) is still searched for a secret.
_HEADS = (
    re.compile(r"(?<![\w.-])(?P<quote>[\"']?)(?P<name>" + _NAME + r")(?P=quote)[ \t]*[=:][ \t]*"),
    re.compile(r"(?<![\w-])--?(?P<name>[A-Za-z][A-Za-z0-9_.-]*)(?:=|(?P<apart>[\"']?[ \t]*,[ \t]*[\"']?|[ \t]+))"),
)
_PATTERNS = (
    (re.compile(r"hf_[A-Za-z0-9]{10,}"), MASK),
    (re.compile(r"(?i)(?P<head>\bauthorization[\"']?[ \t]*[:=][ \t]*[\"']?)"
                r"(?:(?:bearer|basic|token)[ \t]+)?[^\s\"',;]+"), r"\g<head>" + MASK),
    (re.compile(r"(?i)(?P<head>\bbearer[ \t]+)[A-Za-z0-9._~+/=-]+"), r"\g<head>" + MASK),
    (re.compile(r"(?P<head>://[^/\s:@\"']+:)[^/\s@\"']+(?=@)"), r"\g<head>" + MASK),
)


def _masked_value(value: str) -> str:
    """MASK in the value's own quotes or brackets."""
    if len(value) >= 2 and value[0] in "\"'[" and value[-1] == {"[": "]"}.get(value[0], value[0]):
        return value[0] + MASK + value[-1]
    return MASK


def _line(match: re.Match[str]) -> str:
    if not looks_secret(match.group("name")):
        return match.group(0)
    return match.group("lead") + match.group("name") + match.group("sep") + MASK


def _mask_after(head: re.Pattern[str], text: str) -> str:
    """TEXT with the value after each HEAD of a secret-looking name masked.

    A flag set apart from its value (by blanks or a comma) takes no value that starts with "-": another flag.
    """
    out: list[str] = []
    done = 0
    for match in head.finditer(text):
        if match.start() < done or not looks_secret(match.group("name")):
            continue
        value = _VALUE.match(text, match.end())
        if value is None or (match.groupdict().get("apart") and value.group(0).startswith("-")):
            continue
        out += [text[done:match.end()], _masked_value(value.group(0))]
        done = value.end()
    return "".join(out) + text[done:]


def _literals(secrets: Iterable[Any]) -> list[str]:
    """Each secret as written and as escaped in JSON, longest first (so none leaves a part of another)."""
    found: set[str] = set()
    for secret in secrets or ():
        if secret is None or str(secret) == "":
            continue
        text = str(secret)
        found.add(text)
        found.add(json.dumps(text)[1:-1])
    return sorted(found, key=lambda s: (-len(s), s))


def _mask_string(text: str, literals: list[str]) -> str:
    for literal in literals:
        text = text.replace(literal, MASK)
    text = _LINE.sub(_line, text)
    for head in _HEADS:
        text = _mask_after(head, text)
    for pattern, replacement in _PATTERNS:
        text = pattern.sub(replacement, text)
    return text


def _hide(value: Any) -> Any:
    """Every string inside VALUE masked (the value of a secret-looking key); numbers and booleans kept."""
    if isinstance(value, str):
        return MASK
    if isinstance(value, list):
        return [_hide(item) for item in value]
    if isinstance(value, dict):
        return {key: _hide(item) for key, item in value.items()}
    return value


def _mask_json(value: Any, literals: list[str]) -> Any:
    if isinstance(value, str):
        return _mask_string(value, literals)
    if isinstance(value, list):
        words = mask_argv(value) if value and all(isinstance(word, str) for word in value) else value
        return [_mask_json(word, literals) for word in words]
    if isinstance(value, dict):
        return {key: _hide(item) if looks_secret(key) else _mask_json(item, literals) for key, item in value.items()}
    return value


def _as_json(text: str) -> tuple[bool, Any]:
    """Whether TEXT is one JSON object or array, and its value."""
    if not text.lstrip().startswith(("{", "[")):
        return False, None
    try:
        return True, json.loads(text)
    except ValueError:
        return False, None


def mask_text(value: Any, secrets: Iterable[Any] = ()) -> str:
    """VALUE as text with the given literal SECRETS and every secret-looking value masked."""
    text = "" if value is None else value if isinstance(value, str) else str(value)
    literals = _literals(secrets)
    is_json, document = _as_json(text)
    if is_json:
        masked = json.dumps(_mask_json(document, literals), indent=4, ensure_ascii=False)
        return masked + ("\n" if text.endswith("\n") else "")
    return _mask_string(text, literals)


class FilterModule:
    """sparkserve diagnostic filters."""

    def filters(self) -> dict[str, Any]:
        return {"mask_text": mask_text}
