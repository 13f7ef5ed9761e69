"""A deployment's releases: what names a staged overlay set, and which releases retention removes.

A release is what one launch of a deployment ran, as the head records it
(DEPLOYMENTS/NAME/releases/FINGERPRINT.json): the render, the image it ran,
the model and draft revisions it mounted and the overlay set it mounted.
Pure functions of those records; the release role reads and writes them.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Dict, Iterable, List, Mapping, Sequence, Tuple


def overlay_set_id(overlays: Sequence[Mapping[str, Any]]) -> str:
    """The folder name of one overlay set: 16 hex digits of the sha256 of its (path, result) pairs.

    Two recipes with the same patched results share it; a changed patch gets a
    new folder, so staging a new set never touches the files a serving release mounts.
    """
    pairs = sorted((str(o["path"]), str(o["result_sha256"])) for o in overlays)
    return hashlib.sha256(json.dumps(pairs).encode("utf-8")).hexdigest()[:16] if pairs else ""


def _weights(record: Mapping[str, Any]) -> List[str]:
    recipe = record.get("recipe") or {}
    held = []
    for key in ("model", "draft_model"):
        part = recipe.get(key) or {}
        if part.get("repo") and part.get("revision"):
            held.append("%s/%s" % (part["repo"], part["revision"]))
    return held


def _image(record: Mapping[str, Any]) -> List[str]:
    image = (record.get("recipe") or {}).get("image")
    return [image] if image else []


def _overlays(record: Mapping[str, Any]) -> List[str]:
    set_id = overlay_set_id((record.get("recipe") or {}).get("overlays") or [])
    return [set_id] if set_id else []


def _unused(pruned: Iterable[Mapping[str, Any]], kept: Iterable[Mapping[str, Any]], part: Any) -> List[str]:
    kept_parts = {p for r in kept for p in part(r)}
    return sorted({p for r in pruned for p in part(r)} - kept_parts)


def retention(records: Sequence[Mapping[str, Any]], keep: int, protect: Sequence[str]) -> Dict[str, Any]:
    """Which releases to remove, and which of their weights, images and overlay sets no kept release uses.

    The ``keep`` newest releases that served (by ``recorded_at``) stay, and so
    does every release whose fingerprint is in ``protect`` (the one running,
    the one staged), whatever its age. A release recorded as failed never
    counts as one of the kept. Returns the fingerprints kept and removed, and
    the model revisions (REPO/REVISION), images and overlay set folders only
    removed releases use.
    """
    if keep < 1:
        raise ValueError("keep must be at least 1, not %d" % keep)
    ordered = sorted(records, key=lambda r: float(r.get("recorded_at") or 0), reverse=True)
    served = [r for r in ordered if not r.get("failed")]
    kept_fps = {r["fingerprint"] for r in served[:keep]} | set(protect)
    kept = [r for r in ordered if r["fingerprint"] in kept_fps]
    pruned = [r for r in ordered if r["fingerprint"] not in kept_fps]
    return {
        "kept": [r["fingerprint"] for r in kept],
        "removed": [r["fingerprint"] for r in pruned],
        "weights": _unused(pruned, kept, _weights),
        "images": _unused(pruned, kept, _image),
        "overlay_sets": _unused(pruned, kept, _overlays),
    }


def downtime(last_old_s: float, first_new_s: float, load_s: float) -> Tuple[float, float]:
    """The upgrade's downtime (last completion of the old release to the first of the new) and that minus the load."""
    total = max(0.0, first_new_s - last_old_s)
    return round(total, 1), round(max(0.0, total - load_s), 1)
