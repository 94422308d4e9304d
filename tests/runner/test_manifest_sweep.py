"""A sweep restricted by a manifest runs exactly the listed records whose bytes match, and says what it left out."""

from __future__ import annotations

import json
from pathlib import Path

from helpers.sweeps import make_config, rows
from rcarun.data import Manifest, ManifestRecord, bundled_sample_path, iter_dataset, save_manifest
from rcarun.mock import MockConfig, MockServer
from rcarun.runner import load_sweep_config, run_sweep


async def test_only_listed_records_with_matching_hashes_run(tmp_path: Path) -> None:
    records = [r.trajectory for r in iter_dataset(bundled_sample_path())]
    chosen, tampered = records[0], records[1]
    manifest = Manifest(
        records=(
            ManifestRecord(chosen.qid, chosen.source, chosen.sha256),
            ManifestRecord(tampered.qid, tampered.source, "0" * 64),
            ManifestRecord("nowhere/1", "nowhere", "1" * 64),
        )
    )
    path = tmp_path / "manifest.json"
    save_manifest(manifest, path)
    db = tmp_path / "results.db"
    async with MockServer(MockConfig(latency_s=0.001)) as server:
        config = make_config({"sim": {"base_url": server.base_url}})
        config = config.model_copy(update={"sweep": config.sweep.model_copy(update={"manifest": str(path)})})
        outcome = await run_sweep(config, db_path=db, run_name="m", show_progress=False)

    assert outcome.status == "finished"
    assert rows(db, "SELECT qid FROM predictions") == [(chosen.qid,)]
    assert rows(db, "SELECT qid FROM trajectories") == [(chosen.qid,)]
    problems = [
        json.loads(d) for (d,) in rows(db, "SELECT detail_json FROM run_events WHERE kind = 'data_problem'")
    ]
    assert sorted(p["record"] for p in problems) == sorted([tampered.qid, "nowhere/1"])
    assert outcome.data_problems == 2


def test_config_resolves_a_manifest_path_and_names_the_official_list(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    body = """
[sweep]
dataset = "data"
manifest = "{manifest}"
[[methods]]
name = "all-at-once"
[backbones.sim]
provider = "simulated"
model = "m"
base_url = "http://127.0.0.1:9/v1"
"""
    file = tmp_path / "sub" / "sweep.toml"
    file.write_text(body.format(manifest="lists/mini.json"))
    assert load_sweep_config(file).sweep.manifest == str(tmp_path / "sub" / "lists" / "mini.json")
    file.write_text(body.format(manifest="longrca-mini"))
    assert load_sweep_config(file).sweep.manifest == "longrca-mini"
