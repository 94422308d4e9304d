"""How big results.db is under each way of storing blobs, on a real sweep: the figures behind docs/schema.md.

Issue 19 asks for prompts and answers SQLite can read (datasette, sqlite-utils, the ``calls_text`` view) and
for the storage choice to be made by measured size. This script runs (or reuses) a sweep, then copies its file
once per storage form, rewrites the ``blobs`` table into that form, VACUUMs and weighs it, so every form is
measured on the same rows:

- ``zlib`` — every blob zlib-compressed (rcarun before migration 4);
- ``text<=N`` — UTF-8 blobs of at most N bytes as plain ``text`` instead of compressed, larger ones compressed;
- ``text<=N+zlib`` — the same plain text beside a compressed copy of every blob;
- ``text`` — every UTF-8 blob plain.

The Mini-sized sweep (``--mini``) is 200 LongRCA-shaped trajectories whose byte sizes are the official Mini
list's (median 159 KB, 47.8 MB in all), their step texts cut from the bundled Who&When trajectories so they
compress like real agent logs, run with all-at-once on one simulated backbone with a 131,072-token window.
Usage:

    .venv/bin/python benchmarks/blob_storage.py --db /tmp/demo.db           # an existing file (the demo's)
    .venv/bin/python benchmarks/blob_storage.py --mini /tmp/mini.db         # run the Mini-sized sweep first
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import sqlite3
import tempfile
import zlib
from pathlib import Path

from rcarun.data import bundled_sample_path, longrca_mini_manifest_path
from rcarun.mock import MockConfig, MockServer
from rcarun.runner import SweepConfig, run_sweep

_THRESHOLDS = (4_096, 16_384, 65_536, 262_144)


def write_mini_dataset(root: Path, seed: int = 19) -> Path:
    """200 LongRCA-shaped records with the Mini list's sources, ids and byte sizes."""
    rng = random.Random(seed)
    texts = [
        str(step["content"])
        for path in sorted(bundled_sample_path().rglob("*.json"))
        for step in json.loads(path.read_text(encoding="utf-8"))["history"]
        if step.get("content")
    ]
    agents = ("PlanAgent", "ActionAgent", "DiagnostAgent", "Verifier", "Executor")
    listed = json.loads(longrca_mini_manifest_path().read_text(encoding="utf-8"))["files"]
    for entry in listed:
        source = entry["path"].split("/")[-2]
        history: list[dict[str, object]] = []
        size = 200
        while size < entry["bytes"] or len(history) < 2:
            content = rng.choice(texts)
            step = {"step": len(history), "name": agents[len(history) % len(agents)], "role": "assistant"}
            history.append({**step, "content": content})
            size += len(json.dumps(history[-1]))
        mistake = rng.randrange(len(history))
        record = {
            "question_ID": entry["question_ID"],
            "history": history,
            "mistake_agent": history[mistake]["name"],
            "mistake_step": mistake,
            "mistake_reason": "synthetic",
        }
        folder = root / source
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{entry['question_ID']}.json").write_text(json.dumps(record), encoding="utf-8")
    return root


async def run_mini_sweep(db: Path, dataset: Path) -> None:
    async with MockServer(MockConfig(latency_s=0.001)) as server:
        config = SweepConfig.model_validate(
            {
                "sweep": {"dataset": str(dataset), "realizations": 1},
                "methods": [{"name": "all-at-once"}],
                "backbones": {
                    "sim": {
                        "provider": "simulated",
                        "model": "sim-model",
                        "base_url": server.base_url,
                        "context_window": 131_072,
                    }
                },
            }
        )
        await run_sweep(config, db_path=db, run_name="mini", show_progress=False)


def _rewrite(db: Path, form: str, threshold: int) -> None:
    """Store every blob of ``db`` in ``form`` (the module docstring's names) and VACUUM."""
    connection = sqlite3.connect(db, isolation_level=None)
    try:
        columns = {str(row[1]) for row in connection.execute("PRAGMA table_info(blobs)")}
        # Since migration 4 a row holds its bytes as text (zlib_data empty) or compressed (text NULL).
        query = (
            "SELECT sha256, CASE WHEN text IS NULL THEN zlib_data ELSE CAST(text AS BLOB) END, text IS NOT NULL "
            "FROM blobs"
            if "text" in columns
            else "SELECT sha256, zlib_data, 0 FROM blobs"
        )
        rows = connection.execute(query).fetchall()
        connection.execute("DROP TABLE blobs")
        connection.execute(
            "CREATE TABLE blobs (sha256 TEXT PRIMARY KEY, zlib_data BLOB, size INTEGER, text TEXT)"
        )
        connection.execute("BEGIN")
        for sha, stored, plain in rows:
            data = bytes(stored) if plain else zlib.decompress(stored)
            try:
                text: str | None = data.decode("utf-8")
            except UnicodeDecodeError:
                text = None
            readable = text is not None and (form == "text" or len(data) <= threshold)
            compressed = None if readable and form in ("text", "text<=N") else zlib.compress(data, 1)
            connection.execute(
                "INSERT INTO blobs VALUES (?, ?, ?, ?)",
                (sha, compressed, len(data), text if readable else None),
            )
        connection.execute("COMMIT")
        connection.execute("VACUUM")
    finally:
        connection.close()


def measure(db: Path) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        source = Path(scratch) / "source.db"
        with sqlite3.connect(db) as connection:
            connection.execute(f"VACUUM INTO '{source}'")
            calls, blobs, raw = connection.execute(
                "SELECT (SELECT count(*) FROM calls), count(*), sum(size) FROM blobs"
            ).fetchone()
        print(f"{db}: {calls:,} calls, {blobs:,} blobs, {raw / 1e6:.2f} MB of blob bytes uncompressed")
        print(f"{'form':<22} {'file MB':>9} {'blobs readable':>15}")
        forms = [("zlib", 0), *((f"text<={t // 1024}K", t) for t in _THRESHOLDS)]
        forms += [(f"text<={t // 1024}K+zlib", t) for t in _THRESHOLDS[:3]]
        forms += [("text", 0)]
        for label, threshold in forms:
            copy = Path(scratch) / f"{label}.db"
            shutil.copyfile(source, copy)
            form = (
                "zlib"
                if label == "zlib"
                else "text"
                if label == "text"
                else ("text<=N+zlib" if label.endswith("+zlib") else "text<=N")
            )
            if form == "zlib":
                _rewrite(copy, "text<=N", -1)
            else:
                _rewrite(copy, form, threshold)
            with sqlite3.connect(copy) as connection:
                (readable,) = connection.execute(
                    "SELECT count(*) FROM blobs WHERE text IS NOT NULL"
                ).fetchone()
            print(f"{label:<22} {copy.stat().st_size / 1e6:>9.2f} {readable / blobs:>14.0%}")
            copy.unlink()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", type=Path, help="measure this results.db")
    parser.add_argument(
        "--mini", type=Path, help="run the Mini-sized sweep into this file (kept), then measure it"
    )
    arguments = parser.parse_args()
    if arguments.mini is not None:
        if not arguments.mini.exists():
            with tempfile.TemporaryDirectory() as scratch:
                dataset = write_mini_dataset(Path(scratch) / "mini")
                asyncio.run(run_mini_sweep(arguments.mini, dataset))
        measure(arguments.mini)
    if arguments.db is not None:
        measure(arguments.db)


if __name__ == "__main__":
    main()
