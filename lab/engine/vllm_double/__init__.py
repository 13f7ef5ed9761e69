"""vllm_double: a lab double of the vLLM engine, never used on real Sparks.

It runs inside the sparkserve lab's engine image (a Debian root with only
``python3``) in place of vLLM, and behaves like vLLM wherever deployment
tooling can see it: the ``vllm serve`` command line, the multi-node
rendezvous on the master port, real reads of safetensors weights, the
OpenAI-compatible HTTP API, ``/health``, and ``/metrics``. It computes
nothing: generated text is deterministic filler, and timings come from
environment knobs (see ``lab/engine/README.md``).

Standard library only, so that the image needs no pip packages.
"""

from __future__ import annotations

VERSION = "0.31.0+sparkserve.labdouble"
