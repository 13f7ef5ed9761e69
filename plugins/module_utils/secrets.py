"""Names that look like they hold a secret, and their values masked wherever sparkserve prints them.

A name looks secret when one of its words (split at ``_``, ``-``, ``.``, ...)
is KEY, ends with TOKEN or APIKEY, or holds SECRET or PASSWORD (or PASSWD),
in any case: ``HF_TOKEN``, ``OPENAI_API_KEY``, ``api-key``, ``MYAPIKEY``,
``DB_PASSWORD``, ``CLIENT_SECRETS``. Words are compared, not the whole name,
so ``TOKENIZERS_PARALLELISM``, ``VLLM_MAX_TOKENS``, NCCL's ``NCCL_IB_PKEY``
(an InfiniBand partition, not a secret) and ``--ssl-keyfile`` (a path) stay
plain settings. A value that has the form of a well-known credential
(``looks_like_token``: a Hugging Face, OpenAI, GitHub, AWS or Slack token)
is a secret whatever its name (``HF_AUTH=hf_...``). The recipe's validation
refuses both in ``env``, and token-like values in ``engine_args``; the
printers (playbooks/render.yml through the ``mask_secrets`` filter, the
validator's messages) mask their values.

Pure standard library: this file also runs on the nodes.
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Mapping, Sequence

MASK = "********"
# A word that is KEY, ends with one of _ENDINGS or holds one of _INSIDE looks secret.
_ENDINGS = ("TOKEN", "APIKEY")
_INSIDE = ("SECRET", "PASSWORD", "PASSWD")
# The forms of well-known credentials: Hugging Face, OpenAI, GitHub, AWS access key IDs, Slack.
_TOKEN = re.compile(
    r"\b(?:hf_[A-Za-z0-9]{30,}|sk-[A-Za-z0-9_-]{20,}|gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{22,}"
    r"|AKIA[0-9A-Z]{16}|xox[abposr]-[A-Za-z0-9-]{10,})")


def looks_secret(name: Any) -> bool:
    """Whether NAME (an environment variable or a flag) looks like it holds a secret."""
    if not isinstance(name, str):
        return False
    words = [w for w in re.split(r"[^A-Za-z0-9]+", name.upper()) if w]
    return any(word == "KEY" or word.endswith(_ENDINGS) or any(part in word for part in _INSIDE) for word in words)


def looks_like_token(value: Any) -> bool:
    """Whether VALUE holds something with the form of a well-known credential (hf_..., sk-..., ghp_...)."""
    return isinstance(value, str) and _TOKEN.search(value) is not None


def mask_env(env: Mapping[Any, Any]) -> Dict[Any, Any]:
    """A copy of an environment with the value of every secret-looking name, and every token-like value, masked."""
    return {key: (MASK if looks_secret(key) or looks_like_token(value) else value) for key, value in env.items()}


def mask_argv(argv: Sequence[Any]) -> List[Any]:
    """A copy of a command line with the value of every secret-looking flag masked.

    ``--api-key VALUE`` and ``--api-key=VALUE`` both hide VALUE; a bare flag
    followed by another flag is left as it is.
    """
    out: List[Any] = []
    hide_next = False
    for word in argv:
        text = word if isinstance(word, str) else None
        if (hide_next and not (text or "").startswith("--")) or looks_like_token(text):
            out.append(MASK)
            hide_next = False
            continue
        hide_next = False
        if text is not None and text.startswith("-"):
            flag, equals, _ = text.lstrip("-").partition("=")
            if looks_secret(flag):
                if equals:
                    out.append(text.split("=", 1)[0] + "=" + MASK)
                    continue
                hide_next = True
        out.append(word)
    return out
