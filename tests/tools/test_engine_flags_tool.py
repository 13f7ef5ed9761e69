"""tools/engine-flags.py: an engine parser's flags written as the list validation reads back."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from ansible_collections.sparkserve.deploy.plugins.module_utils.engines import known_flags
from tests.scripts import load_script

tool = load_script("tools/engine-flags.py", "engine_flags")


def toy_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="toy")
    parser.add_argument("model_tag")
    parser.add_argument("--max-model-len", "-m", type=int)
    parser.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction)
    parser.add_argument("--headless", action="store_true")
    parser.add_argument("--served-model-name", nargs="+")
    parser.add_argument("-tp", "--tensor-parallel-size", type=int)
    return parser


def test_flags_of_lists_long_options_as_switches_or_values() -> None:
    assert tool.flags_of(toy_parser()) == {
        "enable-prefix-caching": "switch", "headless": "switch", "max-model-len": "value",
        "no-enable-prefix-caching": "switch", "served-model-name": "value", "tensor-parallel-size": "value",
    }


def test_the_written_list_is_what_validation_reads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(tool.PARSERS, "toy", lambda: (toy_parser(), "1.2.3", "toy serve"))
    assert tool.main(["toy", "--made-from", "a test"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["version"] == "1.2.3" and document["made_from"] == "a test"
    (tmp_path / "toy-1.2.3.json").write_text(json.dumps(document), encoding="utf-8")
    (tmp_path / "toy-1.10.0.json").write_text(json.dumps({**document, "version": "1.10.0"}), encoding="utf-8")
    monkeypatch.setattr(known_flags, "FLAGS_DIR", str(tmp_path))
    known_flags.load.cache_clear()
    try:
        assert known_flags.versions("toy") == ["1.2.3", "1.10.0"] and known_flags.newest("toy") == "1.10.0"
        listed = known_flags.load("toy", "1.2.3")
        assert listed.parser == "toy serve" and listed.flags["headless"] == known_flags.SWITCH
        (tmp_path / "toy-2.0.json").write_text(json.dumps({**document, "flags": {"x": "maybe"}}), encoding="utf-8")
        with pytest.raises(ValueError, match="is not a flag list of toy 2.0"):
            known_flags.load("toy", "2.0")
        (tmp_path / "toy-3.0.json").write_text("[1, 2]", encoding="utf-8")
        with pytest.raises(ValueError, match="is not a flag list of toy 3.0"):
            known_flags.load("toy", "3.0")
    finally:
        known_flags.load.cache_clear()
