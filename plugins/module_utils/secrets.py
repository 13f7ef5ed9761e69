"""Names that look like they hold a secret, and their values masked wherever sparkserve prints them.

A name looks secret when one of its words (split at ``_``, ``-``, ``.``, ...)
is KEY, ends with TOKEN or APIKEY, or holds SECRET or PASSWORD (or PASSWD),
in any case: ``HF_TOKEN``, ``OPENAI_API_KEY``, ``api-key``, ``MYAPIKEY``,
``DB_PASSWORD``, ``CLIENT_SECRETS``. Words are compared, not the whole name,
so ``TOKENIZERS_PARALLELISM``, ``VLLM_MAX_TOKENS``, NCCL's ``NCCL_IB_PKEY``
(an InfiniBand partition, not a secret) and ``--ssl-keyfile`` (a path) stay
plain settings. The recipe's validation refuses
such names in ``env``; the printers (playbooks/render.yml through the
``mask_secrets`` filter, the validator's messages) mask their values.

Pure standard library: this file also runs on the nodes.
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Mapping, Sequence

MASK = "********"
# A word that is KEY, ends with one of _ENDINGS or holds one of _INSIDE looks secret.
_ENDINGS = ("TOKEN", "APIKEY")
_INSIDE = ("SECRET", "PASSWORD", "PASSWD")


def looks_secret(name: Any) -> bool:
    """Whether NAME (an environment variable or a flag) looks like it holds a secret."""
    if not isinstance(name, str):
        return False
    words = [w for w in re.split(r"[^A-Za-z0-9]+", name.upper()) if w]
    return any(word == "KEY" or word.endswith(_ENDINGS) or any(part in word for part in _INSIDE) for word in words)


def mask_env(env: Mapping[Any, Any]) -> Dict[Any, Any]:
    """A copy of an environment with the value of every secret-looking name masked."""
    return {key: (MASK if looks_secret(key) else value) for key, value in env.items()}


def mask_argv(argv: Sequence[Any]) -> List[Any]:
    """A copy of a command line with the value of every secret-looking flag masked.

    ``--api-key VALUE`` and ``--api-key=VALUE`` both hide VALUE; a bare flag
    followed by another flag is left as it is.
    """
    out: List[Any] = []
    hide_next = False
    for word in argv:
        text = word if isinstance(word, str) else None
        if hide_next and not (text or "").startswith("--"):
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
