"""A deployment's releases: the overlay set's folder, retention and the downtime figure."""

from __future__ import annotations

import json
from typing import Any

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.sparkserve.deploy.plugins.filter import release as release_filter
from ansible_collections.sparkserve.deploy.plugins.module_utils.node.release import (
    Release,
    ReleaseError,
    downtime,
    overlay_set_id,
    retention,
)

PATCHED = {"path": "/opt/app/a.py", "result_sha256": "a" * 64}
OTHER = {"path": "/opt/app/b.py", "result_sha256": "b" * 64}


def test_an_overlay_set_is_named_by_its_results_in_any_order() -> None:
    both = overlay_set_id([PATCHED, OTHER])
    assert len(both) == 16 and int(both, 16) >= 0
    assert overlay_set_id([OTHER, PATCHED]) == both
    assert overlay_set_id([PATCHED]) != both
    assert overlay_set_id([dict(PATCHED, result_sha256="c" * 64)]) != overlay_set_id([PATCHED])
    # The original's hash and the patch do not name the set: the result does.
    assert overlay_set_id([dict(PATCHED, patch="x.patch", original_sha256="d" * 64)]) == overlay_set_id([PATCHED])
    assert overlay_set_id([]) == ""


def test_the_filter_says_what_an_overlay_lacks() -> None:
    with pytest.raises(AnsibleFilterError, match="each overlay needs path and result_sha256"):
        release_filter.overlay_set_id([{"path": "/x"}])


def record(fingerprint: str, at: float, revision: str, image: str = "reg/engine@sha256:1",
           overlays: list[dict[str, str]] | None = None, failed: str = "") -> dict[str, Any]:
    recipe = {"image": image, "model": {"repo": "org/model", "revision": revision}, "overlays": overlays or []}
    return {"fingerprint": fingerprint, "recorded_at": at, "recipe": recipe, **({"failed": failed} if failed else {})}


def test_retention_keeps_the_newest_that_served_and_removes_what_only_older_ones_use() -> None:
    records = [
        record("r1", 100, "rev1", image="reg/engine@sha256:old", overlays=[PATCHED]),
        record("r2", 200, "rev2", overlays=[OTHER]),
        record("r3", 300, "rev2", failed="qualification: a gate failed"),
        record("r4", 400, "rev3", overlays=[OTHER]),
    ]
    plan = retention(records, keep=2, protect=["r4"])
    assert plan["kept"] == ["r4", "r2"]
    assert plan["removed"] == ["r3", "r1"]
    # rev2 is also the failed r3's, but the kept r2 uses it.
    assert plan["weights"] == ["org/model/rev1"]
    assert plan["images"] == ["reg/engine@sha256:old"]
    assert plan["overlay_sets"] == [overlay_set_id([PATCHED])]


def test_retention_removes_the_engine_caches_of_an_image_only_removed_releases_use() -> None:
    old, new = "reg/engine@sha256:" + "1" * 64, "reg/engine:v2@sha256:" + "2" * 64
    records = [record("r1", 100, "rev1", image=old), record("r2", 200, "rev1", image=new),
               record("r3", 300, "rev2", image="other/name@sha256:" + "2" * 64)]
    plan = retention(records, keep=1, protect=["r3"])
    assert plan["removed"] == ["r2", "r1"]
    assert plan["images"] == sorted([old, new])
    # r2's image under another name (the same digest) is r3's, so its caches stay.
    assert plan["caches"] == ["sha256-" + "1" * 64]
    # An image that is not pinned by digest (no recipe passes that) has no cache folder to remove.
    assert retention([record("a", 1, "rev1"), record("b", 2, "rev1")], keep=1, protect=["b"])["caches"] == []


def test_a_node_spares_what_its_containers_run_or_mount() -> None:
    old = "reg/engine@sha256:" + "1" * 64
    plan = {"kept": ["r2"], "removed": ["r1"], "weights": ["org/model/rev1", "org/draft/d1"],
            "images": [old, "reg/other@sha256:" + "3" * 64], "caches": ["sha256-" + "1" * 64, "sha256-" + "3" * 64],
            "overlay_sets": ["abc"]}
    # Another deployment's rank on this node: started from the old image by its local name, mounting the old
    # model's revision and a cache folder of the old image.
    other = {"Image": "reg/engine:sha256-" + "1" * 64, "Mounts": [
        {"Source": "/var/lib/sparkserve/models/org/model/rev1", "Destination": "/models/m"},
        {"Source": "/var/lib/sparkserve/cache/sha256-" + "1" * 64 + "/vllm", "Destination": "/root/.cache/vllm"}]}
    # A container of something else, with a mount whose name only starts like a removed folder.
    unrelated = {"Image": "debian:bookworm", "Mounts": [{"Source": "/var/lib/sparkserve/models/org/draft/d10"}]}
    here = release_filter.release_spare_in_use(plan, [other, unrelated], "/var/lib/sparkserve/models/",
                                               "/var/lib/sparkserve/cache")
    assert here["weights"] == ["org/draft/d1"]
    assert here["images"] == ["reg/other@sha256:" + "3" * 64]
    assert here["caches"] == ["sha256-" + "3" * 64]
    # The rest of the plan is the deployment's own: the same on every node.
    assert (here["kept"], here["removed"], here["overlay_sets"]) == (["r2"], ["r1"], ["abc"])
    # A node with no container removes the whole plan.
    assert release_filter.release_spare_in_use(plan, [], "/m", "/c") == plan
    with pytest.raises(AnsibleFilterError, match="release_spare_in_use"):
        release_filter.release_spare_in_use({"images": []}, [], "/m", "/c")


def test_retention_never_removes_the_running_release_however_old() -> None:
    records = [record("running", 10, "rev0"), record("b", 20, "rev1"), record("c", 30, "rev2")]
    plan = retention(records, keep=1, protect=["running"])
    assert set(plan["kept"]) == {"running", "c"}
    assert plan["removed"] == ["b"]
    assert plan["weights"] == ["org/model/rev1"]


def test_retention_keeps_a_draft_model_a_kept_release_mounts() -> None:
    kept = record("new", 20, "rev2")
    kept["recipe"]["draft_model"] = {"repo": "org/draft", "revision": "d1"}
    old = record("old", 10, "rev1")
    old["recipe"]["draft_model"] = {"repo": "org/draft", "revision": "d1"}
    plan = retention([old, kept], keep=1, protect=["new"])
    assert plan["weights"] == ["org/model/rev1"]


def test_retention_refuses_to_keep_nothing() -> None:
    with pytest.raises(ValueError, match="keep must be at least 1, not 0"):
        retention([record("a", 1, "r")], keep=0, protect=[])
    with pytest.raises(AnsibleFilterError, match="release_retention: keep must be at least 1"):
        release_filter.release_retention([record("a", 1, "r")], 0)


def test_downtime_and_downtime_beside_the_load() -> None:
    assert downtime(100.0, 113.2, 8.4) == (13.2, 4.8)
    # A clock step backwards never gives a negative figure.
    assert downtime(100.0, 99.0, 5.0) == (0.0, 0.0)
    assert release_filter.release_downtime("100", "112.5", "2.5") == [12.5, 10.0]


# ---------------------------------------------------------------- the record's schema

FULL = {"deployment": "lab-tp2", "fingerprint": "f" * 16, "recipe": {"name": "lab-tp2", "image": "reg/e@sha256:1"},
        "ranks": {"0": {"rank": 0, "container_name": "lab-tp2-rank0"}}, "adapter": {"name": "vllm"},
        "ready_after_s": 21.5, "started_at": 1764640000.5, "recorded_at": 1764640030.25}


def test_a_record_goes_through_its_file_unchanged() -> None:
    text = Release.from_dict(FULL).to_json()
    assert json.loads(text) == FULL and text.startswith('{\n    "adapter"')  # as to_nice_json writes it
    assert Release.from_json(text).to_dict() == FULL
    failed = Release.from_json(text).marked_failed(["rank 1 on spark-2 stopped", "qualify: 3 tok/s < 5"])
    assert failed.to_dict() == dict(FULL, failed="rank 1 on spark-2 stopped; qualify: 3 tok/s < 5")


def test_a_bad_record_is_refused_one_sentence_a_problem() -> None:
    bad = dict(FULL, recorded_at="yesterday", ranks=[], colour="blue")
    del bad["fingerprint"]
    with pytest.raises(ReleaseError) as caught:
        Release.from_dict(bad, "current.json")
    assert str(caught.value) == (
        "current.json has no fingerprint; it is not a release record the launch wrote. "
        "current.json: ranks is []; it must be a mapping. "
        'current.json: recorded_at is "yesterday"; it must be a number. '
        "current.json has colour, which no release record holds; remove it or add it to "
        "plugins/module_utils/node/release.py.")
    with pytest.raises(ReleaseError, match="^current.json is not JSON"):
        Release.from_json("{", "current.json")
    with pytest.raises(ReleaseError, match="holds list, not a mapping"):
        Release.from_json("[]", "current.json")


def test_retention_refuses_a_record_without_its_fingerprint_and_lets_old_fields_through() -> None:
    old = dict(record("a", 1, "1" * 40), recorded_by="an older launch")
    assert retention([old], 1, [])["kept"] == ["a"]
    with pytest.raises(ReleaseError, match="release record 0 has no fingerprint"):
        retention([{"recorded_at": 1, "recipe": {}}], 1, [])


def test_the_filters_write_read_and_mark_the_record() -> None:
    text = release_filter.release_record(FULL)
    assert release_filter.release_parse(text, "current.json") == FULL
    marked = json.loads(release_filter.release_mark_failed(text, ["it broke"]))
    assert marked["failed"] == "it broke"
    with pytest.raises(AnsibleFilterError, match="release_record: the release record: started_at is null"):
        release_filter.release_record(dict(FULL, started_at=None))


def test_the_launch_writes_the_fields_of_the_schema() -> None:
    """The engine's record (roles/engine/tasks/record.yml, __engine_record) has exactly the schema's written fields."""
    import re
    from pathlib import Path

    from ansible_collections.sparkserve.deploy.plugins.module_utils.node import release

    text = (Path(__file__).resolve().parents[2] / "roles/engine/tasks/record.yml").read_text(encoding="utf-8")
    block = text[text.index("__engine_record: >-"):text.index("now().timestamp()}")]
    written = set(re.findall(r"'([a-z_]+)':", block))
    assert written == set(release._FIELDS) - {"failed"}
