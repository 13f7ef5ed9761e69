"""An environment or a command line with the values of secret-looking names masked, for printing."""

from __future__ import annotations

from typing import Any

from ansible_collections.sparkserve.deploy.plugins.module_utils.secrets import mask_argv, mask_env

DOCUMENTATION = r"""
name: mask_secrets
short_description: Mask the values of secret-looking names in an environment or a command line
version_added: "0.1.0"
description:
  - For printing only. A name looks secret when one of its words is C(KEY), ends with C(TOKEN) or C(APIKEY), or
    holds C(SECRET) or C(PASSWORD), in any case (C(HF_TOKEN), C(OPENAI_API_KEY), C(api-key); not
    C(TOKENIZERS_PARALLELISM) or C(NCCL_IB_PKEY)); its value is replaced by C(********).
  - A mapping is an environment (name to value); a list is a command line, where the word after a
    secret-looking flag (C(--api-key VALUE)), or the part after its C(=), is masked.
  - A value with the form of a well-known credential (a Hugging Face C(hf_...), OpenAI C(sk-...), GitHub, AWS
    or Slack token) is masked whatever its name, in an environment and on a command line.
  - A recipe's C(env) may not hold such names or values (the validator refuses them); this covers every other
    way a value reaches what sparkserve prints.
options:
  _input:
    description: An environment (a mapping) or a command line (a list of words). Anything else is returned as is.
    type: raw
    required: true
"""

EXAMPLES = r"""
shown: "{{ {'HF_TOKEN': 'hf_x', 'NCCL_DEBUG': 'INFO'} | sparkserve.deploy.mask_secrets }}"
# {'HF_TOKEN': '********', 'NCCL_DEBUG': 'INFO'}
command: "{{ ['vllm', 'serve', '--api-key', 'sk-x'] | sparkserve.deploy.mask_secrets | join(' ') }}"
# vllm serve --api-key ********
"""

RETURN = r"""
_value:
  description: A copy of the input with the secret values masked.
  type: raw
"""


def mask_secrets(value: Any) -> Any:
    """An environment or command line with the values of secret-looking names masked."""
    if isinstance(value, dict):
        return mask_env(value)
    if isinstance(value, (list, tuple)):
        return mask_argv(value)
    return value


class FilterModule:
    """sparkserve printing filters."""

    def filters(self) -> dict[str, Any]:
        return {"mask_secrets": mask_secrets}
