"""A deployment's releases: the record's file written and read through its schema, the folder of an overlay
set, and what retention removes."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from ansible.errors import AnsibleFilterError

from ansible_collections.sparkserve.deploy.plugins.module_utils.node import release

DOCUMENTATION = r"""
name: overlay_set_id
short_description: The folder name of a recipe's overlay set
version_added: "0.1.0"
description:
  - 16 hex digits of the sha256 of the set's (path, result_sha256) pairs; empty for no overlays.
  - The overlays stage writes the set under OVERLAYS/DEPLOYMENT/ID and the ranks mount it from there,
    so a new set is staged beside the one a serving release mounts.
options:
  _input:
    description: The recipe's overlays (each with path and result_sha256).
    type: list
    elements: dict
    required: true
"""

EXAMPLES = r"""
dest: "{{ sparkserve_overlays_dir }}/{{ deployment }}/{{ recipe_config.overlays | sparkserve.deploy.overlay_set_id }}"
kept: "{{ records | sparkserve.deploy.release_retention(2, [current_fingerprint]) }}"
# This node's part: less what a container of the node runs or mounts (community.docker.docker_host_info).
here: "{{ kept | sparkserve.deploy.release_spare_in_use(host_info.containers, models_dir, cache_dir) }}"
# The release record's file (module_utils/node/release.py is its schema), written, read and marked failed:
content: >-
  {{ {'deployment': engine_deployment, 'fingerprint': fingerprint, 'recipe': engine_recipe, 'ranks': engine_ranks,
      'adapter': engine_adapter, 'ready_after_s': waited_s, 'started_at': started_at,
      'recorded_at': now().timestamp()} | sparkserve.deploy.release_record }}
serving: "{{ current.content | b64decode | sparkserve.deploy.release_parse('current.json') }}"
marked: "{{ record.content | b64decode | sparkserve.deploy.release_mark_failed(release_failures) }}"
"""

RETURN = r"""
_value:
  description: >-
    The set's folder name (overlay_set_id); what retention keeps and removes (release_retention), on one node
    (release_spare_in_use).
  type: raw
"""


def overlay_set_id(overlays: Sequence[Mapping[str, Any]]) -> str:
    try:
        return release.overlay_set_id(overlays or [])
    except (KeyError, TypeError) as exc:
        raise AnsibleFilterError("overlay_set_id: each overlay needs path and result_sha256 (%s)" % exc) from exc


def release_retention(records: Sequence[Mapping[str, Any]], keep: int, protect: Sequence[str] = ()) -> dict[str, Any]:
    try:
        return release.retention(list(records), int(keep), list(protect))
    except (KeyError, TypeError, ValueError) as exc:
        raise AnsibleFilterError("release_retention: %s" % exc) from exc


def release_spare_in_use(plan: Mapping[str, Any], containers: Sequence[Mapping[str, Any]], models_dir: str,
                         cache_dir: str) -> dict[str, Any]:
    try:
        return release.spare_in_use(plan, list(containers), str(models_dir), str(cache_dir))
    except (KeyError, TypeError, AttributeError) as exc:
        raise AnsibleFilterError("release_spare_in_use: %s" % exc) from exc


def release_record(fields: Mapping[str, Any]) -> str:
    """The release record's file for FIELDS (the launch's), refused with one sentence per bad field."""
    try:
        return release.Release.from_dict(dict(fields)).to_json()
    except release.ReleaseError as exc:
        raise AnsibleFilterError("release_record: %s" % exc) from exc


def release_parse(text: str, where: str = "the release record") -> dict[str, Any]:
    """A release record's file read (slurped and decoded) into its fields, refused when it is not one."""
    try:
        return release.Release.from_json(text, where).to_dict()
    except release.ReleaseError as exc:
        raise AnsibleFilterError("release_parse: %s" % exc) from exc


def release_mark_failed(text: str, reasons: Sequence[str], where: str = "the release record") -> str:
    """A release record's file written again, marked failed for REASONS (retention then never keeps it)."""
    try:
        return release.Release.from_json(text, where).marked_failed(list(reasons)).to_json()
    except release.ReleaseError as exc:
        raise AnsibleFilterError("release_mark_failed: %s" % exc) from exc


def release_downtime(last_old_s: float, first_new_s: float, load_s: float) -> list[float]:
    return list(release.downtime(float(last_old_s), float(first_new_s), float(load_s)))


class FilterModule:
    """sparkserve release filters."""

    def filters(self) -> dict[str, Any]:
        return {"overlay_set_id": overlay_set_id, "release_retention": release_retention,
                "release_spare_in_use": release_spare_in_use,
                "release_downtime": release_downtime, "release_record": release_record,
                "release_parse": release_parse, "release_mark_failed": release_mark_failed}
