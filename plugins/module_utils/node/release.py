"""A deployment's releases: the release record's schema, what names a staged overlay set, and retention.

A release is what one launch of a deployment ran, as the head records it
under DEPLOYMENTS/NAME/: ``current.json`` (what serves), ``previous.json``
(what served before) and ``releases/FINGERPRINT.json`` (each release
launched) hold the same record, ``Release``:

- ``deployment`` (str): the deployment's name.
- ``fingerprint`` (str): the render's fingerprint; names the release's file.
- ``recipe`` (mapping): the validated recipe it ran (image, model and draft
  revisions, overlays, ...).
- ``ranks`` (mapping): each rank's render (container, command, ...), by
  rank number (a string, as JSON keys are).
- ``adapter`` (mapping): the engine adapter's facts (name, endpoints, ...).
- ``ready_after_s`` (number): seconds from the first rank's start to ready.
- ``started_at``, ``recorded_at`` (number): unix times of the first rank's
  start and of the record.
- ``failed`` (str, absent when it served): why the release failed, written
  by the rollback; retention never counts a failed release as one it keeps.

``Release.from_json`` / ``from_dict`` read a record and refuse a bad one with
one sentence per problem (``ReleaseError``); ``to_json`` writes it the way
the head keeps it. Pure standard library: the node programs may read it too.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from .images import ImageError, cache_key, digest_hex


class ReleaseError(ValueError):
    """A release record that is not one; the message has one sentence per problem."""


# field -> (JSON types it may hold, the words for them); the record's keys in the order it is written.
_FIELDS: Dict[str, Tuple[Tuple[type, ...], str]] = {
    "deployment": ((str,), "a string"),
    "fingerprint": ((str,), "a string"),
    "recipe": ((dict,), "a mapping"),
    "ranks": ((dict,), "a mapping"),
    "adapter": ((dict,), "a mapping"),
    "ready_after_s": ((int, float), "a number"),
    "started_at": ((int, float), "a number"),
    "recorded_at": ((int, float), "a number"),
    "failed": ((str,), "a string"),
}
# What every reader needs; records older than the other fields lack some of them.
REQUIRED = ("fingerprint", "recipe", "recorded_at")


@dataclasses.dataclass(frozen=True)
class Release:
    """One release record (see the module's docstring)."""

    fingerprint: str
    recipe: Dict[str, Any]
    recorded_at: float
    deployment: str = ""
    ranks: Dict[str, Dict[str, Any]] = dataclasses.field(default_factory=dict)
    adapter: Dict[str, Any] = dataclasses.field(default_factory=dict)
    ready_after_s: Optional[float] = None
    started_at: Optional[float] = None
    failed: str = ""

    @classmethod
    def from_dict(cls, data: Any, where: str = "the release record") -> "Release":
        """The record DATA holds; ReleaseError naming WHERE and each bad field when it is not one."""
        found = problems(data, where)
        if found:
            raise ReleaseError(" ".join(found))
        return cls(**{key: data[key] for key in _FIELDS if key in data})

    @classmethod
    def from_json(cls, text: str, where: str = "the release record") -> "Release":
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise ReleaseError("%s is not JSON (%s); write it again from the launch that made it, or remove it."
                               % (where, exc)) from None
        return cls.from_dict(data, where)

    def to_dict(self) -> Dict[str, Any]:
        """The record as the head keeps it (a release that served has no ``failed``)."""
        data = {key: getattr(self, key) for key in _FIELDS}
        return {key: value for key, value in data.items() if value is not None and (key != "failed" or value)}

    def to_json(self) -> str:
        """The record's file: JSON, indented and sorted as Ansible's to_nice_json writes it."""
        return json.dumps(self.to_dict(), indent=4, sort_keys=True)

    def marked_failed(self, reasons: Sequence[str]) -> "Release":
        """The same release, recorded as failed for REASONS."""
        return dataclasses.replace(self, failed="; ".join(str(r) for r in reasons))


def problems(data: Any, where: str = "the release record", strict: bool = True) -> List[str]:
    """Every way DATA is not a release record, one sentence each ([] when it is one).

    Not STRICT, a field no record holds is let through (retention reads records written by older launches).
    """
    if not isinstance(data, Mapping):
        return ["%s holds %s, not a mapping; it must be a JSON object of a release "
                "(plugins/module_utils/node/release.py)." % (where, type(data).__name__)]
    found = ["%s has no %s; it is not a release record the launch wrote." % (where, key)
             for key in REQUIRED if key not in data]
    for key, value in data.items():
        if key not in _FIELDS:
            if not strict:
                continue
            found.append("%s has %s, which no release record holds; remove it or add it to "
                         "plugins/module_utils/node/release.py." % (where, key))
            continue
        kinds, words = _FIELDS[key]
        if isinstance(value, bool) or not isinstance(value, kinds):
            found.append("%s: %s is %s; it must be %s." % (where, key, json.dumps(value, default=str)[:60], words))
    if isinstance(data.get("fingerprint"), str) and not data["fingerprint"]:
        found.append("%s: fingerprint is empty; it names the release's file." % where)
    return found


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


def _image_caches(record: Mapping[str, Any]) -> List[str]:
    try:
        return [cache_key(image) for image in _image(record)]
    except ImageError:  # not pinned by digest (no recipe passes that), so no cache folder of its own
        return []


def _overlays(record: Mapping[str, Any]) -> List[str]:
    set_id = overlay_set_id((record.get("recipe") or {}).get("overlays") or [])
    return [set_id] if set_id else []


def _unused(pruned: Iterable[Mapping[str, Any]], kept: Iterable[Mapping[str, Any]], part: Any) -> List[str]:
    kept_parts = {p for r in kept for p in part(r)}
    return sorted({p for r in pruned for p in part(r)} - kept_parts)


def retention(records: Sequence[Mapping[str, Any]], keep: int, protect: Sequence[str]) -> Dict[str, Any]:
    """Which releases to remove, and which of their weights, images, engine caches and overlay sets no kept
    release uses.

    The ``keep`` newest releases that served (by ``recorded_at``) stay, and so
    does every release whose fingerprint is in ``protect`` (the one running,
    the one staged), whatever its age. A release recorded as failed never
    counts as one of the kept. Returns the fingerprints kept and removed, and
    the model revisions (REPO/REVISION), images, engine cache folders (one per
    image digest, sha256-<hex>) and overlay set folders only removed releases
    use.
    """
    if keep < 1:
        raise ValueError("keep must be at least 1, not %d" % keep)
    for index, record in enumerate(records):
        found = problems(record, "release record %d" % index, strict=False)
        if found:
            raise ReleaseError(" ".join(found))
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
        "caches": _unused(pruned, kept, _image_caches),
        "overlay_sets": _unused(pruned, kept, _overlays),
    }


def spare_in_use(plan: Mapping[str, Any], containers: Sequence[Mapping[str, Any]], models_dir: str,
                 cache_dir: str) -> Dict[str, Any]:
    """A node's part of ``retention``'s PLAN: less what a container of the node uses, running or stopped (as
    Docker lists them, with their mounts), since another deployment of the node may run what this one's removed
    releases used: an image a container was started from (by its digest), the weights (MODELS/REPO/REVISION) and
    the engine caches (CACHE/sha256-<hex>) a container mounts, or mounts a folder of."""
    sources = [str(mount.get("Source") or "") for container in containers for mount in container.get("Mounts") or []]
    started_from = {digest_hex(str(container.get("Image") or "")) for container in containers} - {""}

    def mounted(folder: str) -> bool:
        return any(source == folder or source.startswith(folder + "/") for source in sources)

    return dict(plan,
                images=[image for image in plan["images"] if digest_hex(image) not in started_from],
                weights=[held for held in plan["weights"] if not mounted(f"{models_dir.rstrip('/')}/{held}")],
                caches=[key for key in plan["caches"] if not mounted(f"{cache_dir.rstrip('/')}/{key}")])


def downtime(last_old_s: float, first_new_s: float, load_s: float) -> Tuple[float, float]:
    """The upgrade's downtime (last completion of the old release to the first of the new) and that minus the load."""
    total = max(0.0, first_new_s - last_old_s)
    return round(total, 1), round(max(0.0, total - load_s), 1)
