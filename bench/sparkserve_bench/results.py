"""The results document: the run's context (what was measured), loading and checking a results file."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Mapping

from . import RESULTS_FORMAT
from .errors import BenchError
from .suites import load_document

# What a run was of; every key is always written (null when not given).
CONTEXT_KEYS = ("recipe", "model_revision", "image_digest", "overlays", "node_count", "notes", "extra")
# Written by the run itself.
RUN_KEYS = ("time", "finished", "base_url", "model")
_REVISION = re.compile(r"[0-9a-f]{40}")
_DIGEST = re.compile(r"(?:.+@)?sha256:[0-9a-f]{64}")


def build_context(file_data: Any, flags: Mapping[str, Any], where: str = "--context") -> tuple[dict[str, Any],
                                                                                               list[str]]:
    """The context from a file's mapping and the CLI flags (flags win); (context, warnings)."""
    if file_data is None:
        file_data = {}
    if not isinstance(file_data, dict):
        raise BenchError("%s: give a mapping with %s" % (where, ", ".join(CONTEXT_KEYS)))
    problems = []
    for key in file_data:
        if key in RUN_KEYS:
            problems.append("%s: %s is written by the run itself; remove it" % (where, key))
        elif key not in CONTEXT_KEYS:
            problems.append("%s: unknown key %r; give %s (anything else under extra:)"
                            % (where, key, ", ".join(CONTEXT_KEYS)))
    context: dict[str, Any] = {key: file_data.get(key) for key in CONTEXT_KEYS}
    for key, value in flags.items():
        if value not in (None, [], ()):
            context[key] = list(value) if isinstance(value, (list, tuple)) else value
    checks = {"recipe": str, "model_revision": str, "image_digest": str, "notes": str}
    for key, kind in checks.items():
        if context[key] is not None and not isinstance(context[key], kind):
            problems.append("%s: %s is %r; give a string" % (where, key, context[key]))
    count = context["node_count"]
    if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 1):
        problems.append("%s: node_count is %r; give a positive integer" % (where, count))
    if context["overlays"] is not None and not isinstance(context["overlays"], list):
        problems.append("%s: overlays is %r; give a list (names, or mappings with path and sha256)"
                        % (where, context["overlays"]))
    if context["extra"] is not None and not isinstance(context["extra"], dict):
        problems.append("%s: extra is %r; give a mapping" % (where, context["extra"]))
    if problems:
        raise BenchError("\n".join(problems))
    warnings = []
    missing = [key for key in ("recipe", "model_revision", "image_digest", "node_count") if context[key] is None]
    if missing:
        warnings.append("context has no %s: the results will not say what was measured" % ", ".join(missing))
    if isinstance(context["model_revision"], str) and not _REVISION.fullmatch(context["model_revision"]):
        warnings.append("model_revision %r is not a full 40-character commit" % context["model_revision"])
    if isinstance(context["image_digest"], str) and not _DIGEST.fullmatch(context["image_digest"]):
        warnings.append("image_digest %r is not sha256:<64 hex> (or REPO@sha256:...)" % context["image_digest"])
    context["warnings"] = warnings
    return context, warnings


def load_context_file(path: str | None) -> Any:
    return None if path is None else load_document(path)


def write_results(path: str | Path, results: Mapping[str, Any]) -> None:
    try:
        Path(path).write_text(json.dumps(results, indent=1, sort_keys=False) + "\n", encoding="utf-8")
    except OSError as exc:
        raise BenchError("cannot write %s: %s" % (path, exc.strerror or exc)) from None


def is_results(doc: Any) -> bool:
    return isinstance(doc, dict) and doc.get("format") == RESULTS_FORMAT


def load_results(path: str | Path) -> dict[str, Any]:
    """A results file written by ``run``; BenchError if it is not one."""
    doc = load_document(path)
    if not is_results(doc):
        found = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
        raise BenchError("%s is not a sparkserve-bench results file (format %r, want %r); a recipe's published "
                         "figures go in with --recipe-reference" % (path, found, RESULTS_FORMAT))
    cells = doc.get("cells")
    if not isinstance(cells, list) or not all(isinstance(c, dict) and "id" in c and isinstance(c.get("metrics"), dict)
                                              for c in cells):
        raise BenchError("%s: cells must be a list of mappings with id and metrics" % path)
    return dict(doc)
