"""The close_matches filter: what a mistyped name probably meant."""

from __future__ import annotations

from ansible_collections.sparkserve.deploy.plugins.filter.close_matches import FilterModule

close_matches = FilterModule().filters()["close_matches"]
RECIPES = ["glm53-fp4local-mtp-tp2", "glm53-nvfp4-dflash2-tp4", "lab-sglang-tp2", "lab-tp2", "lab-tp4"]


def test_the_closest_names_come_first() -> None:
    assert close_matches("lab-tp22", RECIPES) == ["lab-tp2", "lab-tp4"]
    assert close_matches("lab-tp3", RECIPES) == ["lab-tp4", "lab-tp2"]
    assert close_matches("lab-tp3", RECIPES, 1) == ["lab-tp4"]


def test_nothing_close_is_no_match() -> None:
    assert close_matches("mistral-7b", RECIPES) == []
