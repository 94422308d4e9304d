"""The read commands on results that must not be written: archived, shared, read-only or from an older rcarun;
their output into a pipe that closes early; and flags that name what a run does not have.

Permissions do not bite for root, so the archived-file test runs the commands as ``nobody`` when the tests run
as root (and as ourselves otherwise, where file modes do bite).
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers.users import as_unprivileged, reachable_directory
from rcarun.cli import main
from rcarun.data import bundled_sample_path

_RCARUN = "import sys; from rcarun.cli import main; sys.exit(main())"


def _state(db: Path) -> tuple[bytes, int, list[str]]:
    """What a read must leave as it was: the file's bytes and mtime, and what lies beside it."""
    return db.read_bytes(), db.stat().st_mtime_ns, sorted(p.name for p in db.parent.iterdir())


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory any user can reach (pytest's tmp_path is private to its owner)."""
    with reachable_directory("rcarun-cli-ro-") as folder:
        yield folder


def _rcarun(
    args: list[str], *, other_user: bool = False, home: Path | None = None, **popen: object
) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-c", _RCARUN, *args]
    if other_user:
        argv = as_unprivileged(argv)
    env = dict(os.environ)
    if home is not None:  # somewhere the other user may write (matplotlib's cache)
        env.update(HOME=str(home), MPLCONFIGDIR=str(home / "mpl"))
    return subprocess.run(argv, text=True, timeout=120, check=False, env=env, **popen)  # type: ignore[call-overload, no-any-return]


# -- an archived results.db -----------------------------------------------------------------------------------


@pytest.mark.slow
def test_report_cost_and_export_read_a_read_only_file_in_a_read_only_directory(
    methods_db: Path, shared_dir: Path
) -> None:
    archive = shared_dir / "archive"
    archive.mkdir()
    db = archive / "results.db"
    shutil.copy(methods_db, db)
    out = shared_dir / "out"
    out.mkdir()
    out.chmod(0o777)
    db.chmod(0o444)
    archive.chmod(0o555)
    before = _state(db)

    for other_user in (False, True):  # as the owner (root here: nothing stops a write) and as another user
        for args in (["report", "--resamples", "200"], ["cost", "--json"]):
            argv = [args[0], "--db", str(db), *args[1:]]
            result = _rcarun(argv, other_user=other_user, home=out, capture_output=True)
            assert result.returncode == 0, result.stderr
            assert result.stderr == ""
            assert _state(db) == before
        exported = out / f"export-{other_user}"
        result = _rcarun(
            ["export", "--db", str(db), "--backbone", "alpha", "--method", "aao", "--out", str(exported)],
            other_user=other_user,
            home=out,
            capture_output=True,
        )
        assert result.returncode == 0, result.stderr
        assert json.loads((exported / "leaderboard.json").read_text())["method"] == "aao"
        assert _state(db) == before


def _downgrade_to_version_1(db: Path) -> None:
    """What rcarun before migration 2 wrote: no run_leases, calls.usage_source or predictions.fallback (nor
    migration 4's views and blob text: its text blobs go back to zlib)."""
    connection = sqlite3.connect(db, isolation_level=None)
    try:
        for view in ("calls_text", "predictions_scored", "run_summary"):
            connection.execute(f"DROP VIEW {view}")
        texts = connection.execute("SELECT sha256, text FROM blobs WHERE text IS NOT NULL").fetchall()
        for sha256, text in texts:
            connection.execute(
                "UPDATE blobs SET zlib_data = ? WHERE sha256 = ?", (zlib.compress(text.encode()), sha256)
            )
        connection.execute("ALTER TABLE blobs DROP COLUMN text")
        connection.execute("DROP TABLE run_leases")
        connection.execute("ALTER TABLE calls DROP COLUMN usage_source")
        connection.execute("ALTER TABLE predictions DROP COLUMN fallback")
        connection.execute("DELETE FROM migrations WHERE version > 1")
    finally:
        connection.close()


def test_a_results_db_from_an_older_rcarun_reads_the_same_and_stays_old(
    methods_db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old = tmp_path / "old" / "results.db"
    old.parent.mkdir()
    shutil.copy(methods_db, old)
    _downgrade_to_version_1(old)
    before = _state(old)
    for args in (["cost", "--json"], ["report", "--json", "--resamples", "200"]):
        assert main([args[0], "--db", str(methods_db), *args[1:]]) == 0
        current = json.loads(capsys.readouterr().out)
        assert main([args[0], "--db", str(old), *args[1:]]) == 0
        read_old = capsys.readouterr()
        assert read_old.err == ""
        # The same figures; only the file the report names differs.
        assert {**json.loads(read_old.out), "db": None} == {**current, "db": None}
    assert _state(old) == before
    with sqlite3.connect(old) as connection:
        assert connection.execute("SELECT max(version) FROM migrations").fetchone() == (1,)


# -- a reader that goes away ----------------------------------------------------------------------------------


def _into_closed_pipe(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run rcarun with stdout a pipe whose reader has already gone: its first write fails."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return _rcarun(args, stdout=write_end, stderr=subprocess.PIPE, cwd=cwd)
    finally:
        os.close(write_end)


@pytest.mark.slow
def test_every_printing_command_ends_quietly_with_141_when_stdout_is_closed(
    methods_db: Path, tmp_path: Path
) -> None:
    db = ["--db", str(methods_db)]
    exported = tmp_path / "export"
    assert main(["export", *db, "--backbone", "beta", "--method", "aao", "--out", str(exported)]) == 0
    commands = [
        ["report", *db, "--resamples", "100"],
        ["report", *db, "--json", "--resamples", "100"],
        ["cost", *db],
        ["cost", *db, "--json"],
        ["export", *db, "--backbone", "alpha", "--method", "aao", "--out", str(tmp_path / "again")],
        ["score", str(exported / "predictions.jsonl"), "--references", str(bundled_sample_path())],
        ["data", "check", str(bundled_sample_path())],
        ["estimate", "--samples", "1", "--against", str(methods_db)],
    ]
    for args in commands:
        result = _into_closed_pipe(args, tmp_path)
        assert (result.returncode, result.stderr) == (141, ""), args


def test_report_into_head_dash_1_ends_quietly(methods_db: Path, tmp_path: Path) -> None:
    """``rcarun report | head -1``: the reader takes one line and leaves while the report is still being written."""
    fcntl = pytest.importorskip("fcntl")
    if not hasattr(fcntl, "F_SETPIPE_SZ"):
        pytest.skip("cannot shrink a pipe here")
    read_end, write_end = os.pipe()
    fcntl.fcntl(
        write_end, fcntl.F_SETPIPE_SZ, 4096
    )  # far less than the report, so the writer must wait on us
    try:
        child = subprocess.Popen(
            [sys.executable, "-c", _RCARUN, "report", "--db", str(methods_db), "--resamples", "100"],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            cwd=tmp_path,
        )
    finally:
        os.close(write_end)
    first = b""
    while not first.endswith(b"\n"):
        chunk = os.read(read_end, 1)
        assert chunk, "the report ended before its first line"
        first += chunk
    os.close(read_end)
    _, stderr = child.communicate(timeout=120)
    assert first.startswith(b"rcarun report")
    assert (child.returncode, stderr) == (141, "")


# -- flags that name what the run does not have ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["report", "--compare-backbones", "alpha,gamma"],
            "--compare-backbones: run 'two' has no backbone 'gamma' (backbones: 'alpha', 'beta')",
        ),
        (
            ["report", "--compare-backbones", "alpha"],
            "--compare-backbones needs two or more backbones (each is compared with the first), got 'alpha'",
        ),
        (["report", "--compare-backbones", "beta,beta"], "--compare-backbones names 'beta' more than once"),
        (
            ["report", "--reference", "rcta"],
            "--reference: run 'two' has no method 'rcta' (methods: 'aao', 'aao-notask', 'aao-plain')",
        ),
        (
            ["report", "--populations", "hand_crafted=58,algorithm_generated=126,typo=3"],
            "--populations: run 'two' has no source 'typo' (sources: 'algorithm_generated', 'hand_crafted')",
        ),
        (
            ["report", "--populations", "hand_crafted=58"],
            "--populations: no size for 'algorithm_generated' of run 'two' "
            "(its sources: 'algorithm_generated', 'hand_crafted')",
        ),
        (
            ["export", "--backbone", "gamma", "--method", "aao", "--out", "{out}"],
            "--backbone: run 'two' has no backbone 'gamma' (backbones: 'alpha', 'beta')",
        ),
        (
            ["export", "--backbone", "alpha", "--method", "rcta", "--out", "{out}"],
            "--method: run 'two' has no method 'rcta' (methods: 'aao', 'aao-notask', 'aao-plain')",
        ),
    ],
)
def test_an_unknown_name_is_an_error_naming_the_known_ones(
    methods_db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    argv = [args[0], "--db", str(methods_db), *(a.replace("{out}", str(tmp_path / "out")) for a in args[1:])]
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == f"rcarun: {message}\n"
    assert not (tmp_path / "out").exists()


def test_known_names_still_report_the_comparison(
    methods_db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [
        "report",
        "--db",
        str(methods_db),
        "--json",
        "--resamples",
        "100",
        "--compare-backbones",
        "beta,alpha",
    ]
    argv += ["--populations", "hand_crafted=58,algorithm_generated=126", "--reference", "aao-plain"]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert {(p["backbone_a"], p["backbone_b"]) for p in report["paired_backbones"]} == {("beta", "alpha")}
    assert report["reference_method"] == "aao-plain"


def test_estimate_refuses_reasoning_tokens_for_a_backbone_the_sweep_lacks(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["estimate", "--samples", "1", "--reasoning-tokens", "sim-gtp=100"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rcarun: --reasoning-tokens: the sweep has no backbone 'sim-gtp' (backbones: ")
    assert "'sim-gpt'" in err and err.count("\n") == 1
