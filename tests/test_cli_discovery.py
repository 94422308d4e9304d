"""`rcarun methods`: every registered method, its stages and its options with the defaults the code uses.

The expected values come from the methods' own options models and registry, never from a copy here, so a
new method or option must show up without editing this file.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from typing import Any

import pytest

from rcarun.cli.discovery import add_methods_command, cmd_methods
from rcarun.errors import ConfigError
from rcarun.methods import create_method, registered_methods
from rcarun.methods._options import MethodOptions
from rcarun.methods.all_at_once import AllAtOnceOptions
from rcarun.methods.rcta.method import ABLATIONS, STAGES


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="rcarun")
    add_methods_command(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(["methods", *argv])


def _listing(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, dict[str, Any]]:
    assert cmd_methods(_parse("--json", *argv)) == 0
    return {entry["name"]: entry for entry in json.loads(capsys.readouterr().out)["methods"]}


def test_every_registered_method_is_listed_with_what_its_code_declares(
    capsys: pytest.CaptureFixture[str],
) -> None:
    listing = _listing(capsys)
    assert list(listing) == list(registered_methods())
    for name, entry in listing.items():
        assert entry["description"], f"{name} has no description"
        assert entry["options"], f"{name}: options not found"
        if entry["requires"] is None:
            # The defaults listed are the ones the method runs with when its options table is empty.
            built = create_method(name)
            options = getattr(built, "options", None)
            assert isinstance(options, MethodOptions), f"{name}: options are not a MethodOptions model"
            assert [o["name"] for o in entry["options"]] == list(type(options).model_fields)
            for option in entry["options"]:
                value = getattr(options, option["name"])
                assert option["default"] == (list(value) if isinstance(value, tuple) else value), (
                    name,
                    option,
                )


def test_options_types_stages_and_fixed_values(capsys: pytest.CaptureFixture[str]) -> None:
    listing = _listing(capsys)
    aao = {o["name"]: o for o in listing["all-at-once"]["options"]}
    assert aao["max_tokens"] == {
        "name": "max_tokens",
        "type": "int",
        "default": AllAtOnceOptions().max_tokens,
        "required": False,
        "fixed": False,
        "doc": None,
    }
    assert aao["reasoning"]["type"] == "'off' | 'low' | 'medium' | 'high' | None"
    assert listing["all-at-once"]["stages"] == [AllAtOnceOptions().stage]
    assert listing["rcta"]["stages"] == list(STAGES)
    assert listing["rcta"]["shareable_stages"] == ["outline", "summary"]
    assert listing["continual-search"]["stages"] == ["attribution", "continuation"]
    assert listing["self-consistency"]["stages"] == listing["all-at-once"]["stages"]  # its base's
    for ablation in ABLATIONS:
        fixed = [o for o in listing[f"rcta/{ablation}"]["options"] if o["fixed"]]
        assert [(o["name"], o["default"]) for o in fixed] == [("ablation", ablation)]
    rcta = {o["name"]: o for o in listing["rcta"]["options"]}
    assert rcta["candidate_cap"]["doc"].startswith("base candidates kept before handoff augmentation")
    # The judge panel cannot run on defaults: what it needs is said, and its defaults are still listed.
    panel = listing["judge-panel"]
    assert panel["requires"] == "judge-panel: judges must name at least two different backbones"
    assert {o["name"]: o["default"] for o in panel["options"]}["base"] == "all-at-once"


def test_text_listing_names_each_method_its_stages_and_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    assert cmd_methods(_parse("rcta/no-a2", "all-at-once")) == 0
    text = capsys.readouterr().out
    blocks = text.split("\n\n")
    assert blocks[1].startswith("rcta/no-a2 — ") and blocks[2].startswith("all-at-once — ")
    assert (
        "  stages: summary, outline, attribution (shared by every condition: outline, summary)" in blocks[1]
    )
    assert 'ablation = "no-a2"' in blocks[1] and "fixed by the name" in blocks[1]
    lines = blocks[2].splitlines()
    assert "  stages: attribution" in lines
    assert any(line.split() == ["max_tokens", "=", "8000", "int"] for line in lines)
    assert any(line.split()[:3] == ["reasoning", "=", "unset"] for line in lines)


def test_an_unknown_method_name_is_an_error_listing_the_known_ones() -> None:
    with pytest.raises(ConfigError, match=r"unknown method 'al-at-once' \(known: all-at-once, binary-search"):
        cmd_methods(_parse("all-at-once", "al-at-once"))


def test_a_closed_stdout_ends_methods_quietly() -> None:
    code = "import sys, rcarun.cli.discovery as d, argparse; sys.exit(d.cmd_methods(argparse.Namespace(names=[], json=False)))"
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        result = subprocess.run(
            [sys.executable, "-c", code],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        os.close(write_end)
    assert (result.returncode, result.stderr) == (141, "")


def test_the_rcarun_command_lists_methods_and_says_its_version(capsys: pytest.CaptureFixture[str]) -> None:
    from rcarun.cli import main

    assert main(["methods", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)["methods"]
    names = [entry["name"] for entry in listed]
    assert "all-at-once" in names and "rcta" in names
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.startswith("rcarun ")
