"""The attributes every module of sparkserve.deploy documents: check mode and diff mode."""

from __future__ import annotations


class ModuleDocFragment:
    """sparkserve.deploy.attributes: each module says its support under attributes (full, partial or none)."""

    DOCUMENTATION = r"""
options: {}
attributes:
  check_mode:
    description: Can run in check mode, saying what it would change without changing it.
  diff_mode:
    description: Shows, with --diff, what it changes (or would change in check mode).
"""
