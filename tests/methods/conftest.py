"""The scripted LLM (`helpers.scripted.ScriptedLLM`) as a fixture for the method tests."""

from __future__ import annotations

import pytest

from helpers.scripted import ScriptedLLM


@pytest.fixture
def scripted() -> type[ScriptedLLM]:
    return ScriptedLLM
