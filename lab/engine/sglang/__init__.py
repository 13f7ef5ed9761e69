"""sglang: the SGLang command line of the lab's engine double, never used on real Sparks.

Only ``python3 -m sglang.launch_server ...`` exists here: it reads SGLang's
flags and runs the vLLM lab double (``vllm_double``, beside this package) as
SGLang would behave where deployment tooling can see it. It computes nothing.
See ``lab/engine/README.md``.
"""

from __future__ import annotations

__version__ = "0.5.21+sparkserve.labdouble"
