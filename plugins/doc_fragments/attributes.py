"""The attributes every module of sparkserve.deploy documents: check mode and diff mode."""

from __future__ import annotations


class ModuleDocFragment:
    """sparkserve.deploy.attributes: full check-mode support and no diff unless the module says otherwise."""

    DOCUMENTATION = r"""
options: {}
attributes:
  check_mode:
    description: Can run in check mode, saying what it would change without changing it.
    support: full
  diff_mode:
    description: Shows, with --diff, what it changes (or would change in check mode).
    support: none
"""
