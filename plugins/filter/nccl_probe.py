"""Filters that read the NCCL probe's output and gate it (see module_utils/nccl_probe.py)."""

from __future__ import annotations

from typing import Any, Sequence

from ansible_collections.sparkserve.deploy.plugins.module_utils.nccl_probe import gate, parse

DOCUMENTATION = r"""
name: nccl_probe_report
short_description: What the NCCL probe measured, and why it fails a recipe's gate
version_added: "0.1.0"
description:
  - C(nccl_probe_report) turns the probe's output (with NCCL_DEBUG=INFO lines) into a report - bus bandwidth
    per size and at the largest size, the transport NCCL used between ranks (C(NET/IB), C(NET/Socket), C(P2P),
    C(SHM)), whether the sum was right.
  - C(nccl_probe_gate) lists what fails the gate of O(min_busbw_gbps) and O(transports); empty when it passes.
options:
  _input:
    description: The probe's output (nccl_probe_report), or a report (nccl_probe_gate).
    type: raw
    required: true
"""

EXAMPLES = r"""
report: "{{ probe.stdout | sparkserve.deploy.nccl_probe_report }}"
problems: "{{ report | sparkserve.deploy.nccl_probe_gate(15, ['NET/IB']) }}"
"""

RETURN = r"""
_value:
  description: The report (a dict), or the list of problems.
  type: raw
"""


def nccl_probe_report(text: str) -> dict[str, Any]:
    return parse(text or "")


def nccl_probe_gate(report: dict[str, Any], min_busbw_gbps: float, transports: Sequence[str]) -> list[str]:
    return gate(report, float(min_busbw_gbps), list(transports))


class FilterModule:
    """sparkserve NCCL probe filters."""

    def filters(self) -> dict[str, Any]:
        return {"nccl_probe_report": nccl_probe_report, "nccl_probe_gate": nccl_probe_gate}
