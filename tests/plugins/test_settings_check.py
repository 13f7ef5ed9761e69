"""The inventory's settings, checked against every role's argument spec before any host changes."""

from __future__ import annotations

from pathlib import Path

from ansible_collections.sparkserve.deploy.plugins.module_utils.settings import check, load_options, run

ROOT = Path(__file__).resolve().parents[2]
ROLES = str(ROOT / "roles")


def test_every_role_option_is_known_with_its_role_and_shape() -> None:
    options = load_options(ROLES)
    assert options["fabric_mtu"] == ("fabric", {"type": "int"})
    assert options["monitoring_server"][0] == "monitoring"
    # The shared names (the sparkserve role's, which no play validates) are checked here, once per run.
    assert options["sparkserve_keep_releases"] == ("sparkserve", {"type": "int"})
    # Options shared by several entry points of a role are known once; descriptions and defaults are not shapes.
    assert options["release_qualify"] == ("release", {"type": "str", "choices": ["serving", "new"]})


def test_settings_of_the_right_shape_pass_and_unknown_names_are_left_alone() -> None:
    options = load_options(ROLES)
    assert check(options, {"spark-1": {"fabric_mtu": 9000, "release_qualify": "new", "ansible_host": [1]}}) == []
    # Ansible's own conversions hold: "9000" from an INI inventory is an int.
    assert check(options, {"spark-1": {"fabric_mtu": "9000"}}) == []


def test_a_wrong_type_or_choice_is_one_sentence_naming_every_host() -> None:
    options = load_options(ROLES)
    problems = check(options, {"spark-1": {"fabric_mtu": "jumbo", "release_qualify": "old"},
                               "spark-2": {"fabric_mtu": "jumbo"}})
    assert len(problems) == 2
    mtu = next(p for p in problems if "fabric_mtu" in p)
    assert mtu.startswith("spark-1, spark-2: fabric_mtu is 'jumbo', but the fabric role takes an int (")
    assert mtu.endswith("fix it where the inventory sets it (roles/fabric/README.md lists the role's variables)")
    choice = next(p for p in problems if "release_qualify" in p)
    assert choice.startswith("spark-1: release_qualify is 'old', but the release role takes a str among serving, new")


def test_run_fails_with_every_problem_and_counts_what_it_checked() -> None:
    bad = run({"roles_dir": ROLES, "settings": {"spark-1": {"fabric_mtu": "jumbo"}}})
    assert bad["failed"] and bad["changed"] is False
    assert bad["msg"].startswith("the inventory's settings are refused before any host changes: spark-1: fabric_mtu")
    good = run({"roles_dir": ROLES, "settings": {"spark-1": {"fabric_mtu": 9000, "not_an_option": 1}}})
    assert "failed" not in good and good["checked"] == 1
