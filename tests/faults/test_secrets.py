"""An API key quoted back by the provider reaches no file and no output of rcarun, not even 8 characters of it.

The key (``sk-proj-`` and 48 hex digits) sits in the variable ``api_key_env`` names. The server quotes it in 500
JSON bodies at offsets 0 to 1000 (around the 300-character quoting cut above all), in raw-text 500 bodies after
250 characters of padding, and echoes the Authorization header in 401s, through both transports. Afterwards no
8-character substring of the key may occur in results.db's bytes (WAL included), in any decompressed blob, in the
output of `rcarun sweep`, `report`, `cost`, `export`, or in the exported files. A key pasted into
``extra_headers`` is refused before anything is written.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from faults.conftest import backbone, child_environment, run_cli, sweep_args, write_sweep
from faults.hostile import (
    HostileServer,
    Reply,
    Request,
    echo_authorization,
    echo_secret,
    find_secret,
    make_secret,
    ok,
)

KEY = make_secret(seed=14)
KEY_ENV = "RCARUN_FAULTS_KEY"
# Every 37 characters from 0 to 1000, and densely around the 300-character cut of quoted provider messages.
OFFSETS = sorted(set(range(0, 1001, 37)) | {250, 270, 280, 285, 290, 292, 294, 296, 298, 299, 300, 301})
ITEMS = 24
RUN = "secrets"


def _leaky_policy() -> Callable[[Request], Reply]:
    sent = 0

    def policy(request: Request) -> Reply:
        nonlocal sent
        sent += 1
        if sent <= len(OFFSETS):
            return echo_secret(500, KEY, OFFSETS[sent - 1])
        return (
            echo_secret(500, KEY, 250, raw=True),
            echo_authorization(401),
            ok(),
        )[sent % 3]

    return policy


@pytest.mark.slow
@pytest.mark.parametrize("transport", ["aiohttp", "openai-sdk"])
def test_a_quoted_key_is_nowhere(
    transport: str, serve: Callable[..., HostileServer], dataset: Callable[..., Path], tmp_path: Path
) -> None:
    server = serve(_leaky_policy())
    config = write_sweep(
        tmp_path / "sweep.toml",
        dataset=dataset(ITEMS),
        backbones={"fx": backbone(server.base_url, api_key_env=KEY_ENV, transport=transport)},
    )
    db = tmp_path / "results.db"
    env = child_environment(**{KEY_ENV: KEY})
    outputs: dict[str, str] = {}

    def cli(name: str, *args: str) -> int:
        result = run_cli(list(args), cwd=tmp_path, env=env)
        outputs[f"{name} stdout"] = result.stdout
        outputs[f"{name} stderr"] = result.stderr
        assert name == "sweep" or result.returncode == 0, f"rcarun {name}: {result.describe()}"
        return result.returncode

    cli("sweep", *sweep_args(config, db, RUN))  # most items fail (500, 401): its exit status is not the point
    assert db.is_file(), f"the sweep left no results.db: {outputs}"
    kinds = {entry.kind for entry in server.chat_log()}
    assert {"echo500", "echo500raw", "echo401auth", "ok"} <= kinds, f"the server sent only {kinds}"
    assert sum(entry.kind == "echo500" for entry in server.chat_log()) >= len(OFFSETS)
    cli("report", "report", "--db", str(db), "--run", RUN, "--resamples", "20")
    cli("report --json", "report", "--db", str(db), "--run", RUN, "--resamples", "20", "--json")
    cli("cost", "cost", "--db", str(db), "--run", RUN)
    cli("cost --json", "cost", "--db", str(db), "--run", RUN, "--json")
    out = tmp_path / "export"
    cli(
        "export",
        "export",
        *("--db", str(db), "--run", RUN, "--backbone", "fx", "--method", "all-at-once", "--out", str(out)),
    )

    exported = [path for path in out.rglob("*") if path.is_file()]
    found = find_secret(KEY, db=db, texts=outputs, files=exported)
    assert found == [], "fragments of the key found:\n" + "\n".join(found)


def test_a_key_pasted_into_extra_headers_is_refused(
    serve: Callable[..., HostileServer], dataset: Callable[..., Path], tmp_path: Path
) -> None:
    server = serve(ok())
    config = write_sweep(
        tmp_path / "sweep.toml",
        dataset=dataset(2),
        backbones={"fx": backbone(server.base_url, extra_headers={"Authorization": f"Bearer {KEY}"})},
    )
    db = tmp_path / "results.db"
    result = run_cli(sweep_args(config, db, RUN), cwd=tmp_path)
    assert result.returncode == 2, result.describe()
    assert len(result.stderr_lines()) == 1, f"expected one line:\n{result.stderr}"
    assert not db.exists(), "results.db was created for a config that was refused"
    assert server.chat_log() == [], "requests were sent with a config that must be refused"
    assert find_secret(KEY, texts={"stdout": result.stdout, "stderr": result.stderr}) == []
