"""The loop a sweep runs on: asyncio's own unless uvloop is asked for; a bad choice is one line."""

from __future__ import annotations

import asyncio
import sys

import pytest

from rcarun.errors import ConfigError
from rcarun.runner.loop import EVENT_LOOP_ENV, event_loop_choice, run


async def _loop_module() -> str:
    return type(asyncio.get_running_loop()).__module__.split(".")[0]


def test_asyncio_by_default_and_uvloop_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(EVENT_LOOP_ENV, raising=False)
    assert run(_loop_module()) == "asyncio"
    pytest.importorskip("uvloop")
    monkeypatch.setenv(EVENT_LOOP_ENV, "uvloop")
    assert run(_loop_module()) == "uvloop"
    assert run(_loop_module(), choice="asyncio") == "asyncio"


def test_an_unavailable_uvloop_or_an_unknown_loop_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # importing it now raises ImportError
    monkeypatch.setenv(EVENT_LOOP_ENV, "uvloop")
    main = _loop_module()
    with pytest.raises(ConfigError, match=r"RCARUN_EVENT_LOOP=uvloop but uvloop cannot be imported"):
        run(main)
    assert main.cr_frame is None  # closed, not left unawaited
    with pytest.raises(ConfigError, match=r"RCARUN_EVENT_LOOP='trio': expected one of asyncio, uvloop"):
        event_loop_choice("trio")
