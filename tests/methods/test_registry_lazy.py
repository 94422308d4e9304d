"""The built-in methods load on first use: `BUILT_IN_METHODS` must name exactly what their modules register.

Laziness is checked in a fresh interpreter, since this one has long since imported every method module.
"""

from __future__ import annotations

import importlib
import json
import pkgutil
import subprocess
import sys
from collections.abc import Mapping
from typing import Any

import pytest

import rcarun.methods
from rcarun.errors import ConfigError
from rcarun.methods import Method, create_method, method, registered_methods, registry
from rcarun.methods.registry import BUILT_IN_METHODS


def _fresh_interpreter(script: str) -> Any:
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=False, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_the_table_names_every_decorated_built_in_and_its_module() -> None:
    for module in pkgutil.walk_packages(rcarun.methods.__path__, prefix="rcarun.methods."):
        importlib.import_module(module.name)
    decorated = {
        name: factory.__module__
        for name, factory in registry._REGISTRY.items()
        if factory.__module__.startswith("rcarun.methods.")
    }
    assert decorated == dict(BUILT_IN_METHODS)


def test_a_run_imports_only_the_methods_it_names() -> None:
    seen = _fresh_interpreter(
        "import json, sys\n"
        "import rcarun.runner\n"
        "from rcarun.methods import create_method, registered_methods\n"
        "from rcarun.methods.registry import BUILT_IN_METHODS\n"
        "def loaded(): return sorted(set(BUILT_IN_METHODS.values()) & sys.modules.keys())\n"
        "at_import = loaded()\n"
        "names = list(registered_methods())\n"
        "after_listing = loaded()\n"
        "create_method('all-at-once')\n"
        "print(json.dumps({'at_import': at_import, 'names': names, 'after_listing': after_listing,"
        " 'after_create': loaded()}))\n"
    )
    assert seen["at_import"] == []
    assert seen["names"] == sorted(BUILT_IN_METHODS)
    assert seen["after_listing"] == []
    assert seen["after_create"] == ["rcarun.methods.all_at_once"]


def test_describing_a_method_not_yet_imported_loads_it_and_its_base() -> None:
    described = _fresh_interpreter(
        "import json\n"
        "from rcarun.methods.registry import describe_method\n"
        "rcta = describe_method('rcta/no-a1')\n"
        "panel = describe_method('self-consistency')\n"
        "print(json.dumps({'rcta': rcta.stages, 'panel': panel.stages, 'fixed': [o.name for o in rcta.options or ()"
        " if o.fixed]}))\n"
    )
    assert described["rcta"] == ["summary", "outline", "attribution"]
    assert described["fixed"] == ["ablation"]
    assert described["panel"] is not None


def test_an_unknown_name_lists_every_known_method() -> None:
    with pytest.raises(ConfigError) as refused:
        create_method("no-such-method")
    assert str(refused.value) == f"unknown method 'no-such-method' (known: {', '.join(registered_methods())})"
    assert set(BUILT_IN_METHODS) <= set(registered_methods())


def _stand_in(label: str, options: Mapping[str, Any]) -> Method:
    raise AssertionError("never built")


@pytest.mark.parametrize("name", sorted(BUILT_IN_METHODS))
def test_a_built_in_name_cannot_be_taken_by_another_module(name: str) -> None:
    before = dict(registry._REGISTRY)
    with pytest.raises(ValueError, match="registered twice"):
        method(name)(_stand_in)
    assert dict(registry._REGISTRY) == before


def test_a_third_party_method_registers_and_is_listed() -> None:
    name = "test-registry-lazy-third-party"

    class ThirdParty(Method):
        def __init__(self, label: str, options: Mapping[str, Any]) -> None:
            self.label = label

        async def attribute(self, trajectory: Any, llm: Any) -> Any:
            raise AssertionError("never run")

    try:
        method(name)(ThirdParty)
        assert name in registered_methods()
        assert create_method(name, label="mine").label == "mine"
        with pytest.raises(ValueError, match="registered twice"):
            method(name)(ThirdParty)
    finally:
        registry._REGISTRY.pop(name, None)
    assert name not in registered_methods()
