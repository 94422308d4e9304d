"""`rcarun report`, `cost`, `export` and `score` on real results databases: every figure recomputed from the tables."""

from __future__ import annotations

import base64
import csv
import json
import math
import re
import sqlite3
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from rcarun.cli import main
from rcarun.data import normalize_role


def _json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> Any:
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def _table(db: Path, sql: str, params: tuple[Any, ...] = ()) -> list[sqlite3.Row]:
    connection = sqlite3.connect(db)
    connection.row_factory = sqlite3.Row
    try:
        return connection.execute(sql, params).fetchall()
    finally:
        connection.close()


def _outcomes(db: Path) -> dict[tuple[str, str, int], dict[str, dict[str, Any]]]:
    """(backbone, method, realization) -> qid -> correctness, straight from predictions x trajectories."""
    references = {row["qid"]: row for row in _table(db, "SELECT * FROM trajectories")}
    cells: dict[tuple[str, str, int], dict[str, dict[str, Any]]] = defaultdict(dict)
    for row in _table(db, "SELECT * FROM predictions"):
        ref = references[row["qid"]]
        role = row["pred_role"]
        step = row["pred_step"]
        in_range = step is not None and 0 <= step < ref["n_steps"]
        cells[(row["backbone"], row["method"], row["realization"])][row["qid"]] = {
            "source": ref["source"],
            "role": role is not None and normalize_role(role) == normalize_role(ref["ref_role"]) != "",
            "exact": in_range and step == ref["ref_step"],
            "pm5": in_range and abs(step - ref["ref_step"]) <= 5,
            "step": step if in_range else None,
        }
    return cells


def test_report_json_agrees_with_the_tables(methods_db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = _json(capsys, ["report", "--db", str(methods_db), "--json", "--resamples", "500"])
    qids = [row["qid"] for row in _table(methods_db, "SELECT qid FROM trajectories")]
    cells = _outcomes(methods_db)
    assert report["simulated"] is True and report["expected"] == len(qids) == 10
    # No RCTA component study, natural source proportions: the main protocol, pooled, 500 resamples as asked.
    protocol = report["protocol"]
    assert (protocol["name"], report["aggregate"], protocol["resamples"]) == ("main", "pooled", 500)
    assert protocol["aggregate_reason"].startswith("auto: natural source proportions")
    assert (protocol["abstentions"], protocol["keep_handoff"]) == ("fields", False)
    assert len(report["metrics"]) == 2 * 3 * 2  # backbones x methods x realizations

    for entry in report["metrics"]:
        outcomes = cells[(entry["backbone"], entry["method"], entry["realization"])]
        assert entry["n"] == len(qids)
        assert entry["agent_acc"] == pytest.approx(sum(o["role"] for o in outcomes.values()) / len(qids))
        assert entry["step_acc"] == pytest.approx(sum(o["exact"] for o in outcomes.values()) / len(qids))
        assert entry["step_pm5"] == pytest.approx(sum(o["pm5"] for o in outcomes.values()) / len(qids))
        by_source: dict[str, list[bool]] = defaultdict(list)
        for outcome in outcomes.values():
            by_source[outcome["source"]].append(outcome["exact"])
        macro = sum(sum(v) / len(v) for v in by_source.values()) / len(by_source)
        assert entry["macro"]["step_acc"] == pytest.approx(macro)
        for source, values in by_source.items():
            assert entry["per_source"][source]["step_acc"] == pytest.approx(sum(values) / len(values))

    # Paired: aao (reference, first by name) against the two others on each backbone, realization 0.
    assert report["reference_method"] == "aao"
    paired = {(p["backbone"], p["method_b"], p["metric"]): p for p in report["paired"]}
    others = ("aao-notask", "aao-plain")
    assert set(paired) == {
        (b, o, m) for b in ("alpha", "beta") for o in others for m in ("agent_acc", "step_acc")
    }
    for (backbone, other_method, metric), entry in paired.items():
        a, b = cells[(backbone, "aao", 0)], cells[(backbone, other_method, 0)]
        key = "role" if metric == "agent_acc" else "exact"
        assert entry["wins"] == sum(a[q][key] and not b[q][key] for q in qids)
        assert entry["losses"] == sum(b[q][key] and not a[q][key] for q in qids)
        assert entry["ci_low"] <= entry["delta"] <= entry["ci_high"]
        assert entry["p_mcnemar"] <= entry["p_holm"] <= 1.0
    # Holm over each metric's family of four comparisons: the smallest p is multiplied by 4. The reference is an
    # all-at-once label, not full RCTA, so App. B's family is empty and every comparison is in "other".
    assert {p["family"] for p in paired.values()} == {"other/agent_acc", "other/step_acc"}
    assert all(p["p_holm_joint"] is None for p in paired.values())
    for metric in ("agent_acc", "step_acc"):
        family = sorted((p["p_mcnemar"], p["p_holm"]) for (_, _, m), p in paired.items() if m == metric)
        assert len(family) == 4 and family[0][1] == pytest.approx(min(1.0, 4 * family[0][0]))

    # Complementarity of Step Acc, per other method and against the union of both.
    overlap = {(c["backbone"], c["method_b"]): c for c in report["complementarity"]}
    for backbone in ("alpha", "beta"):
        a = cells[(backbone, "aao", 0)]
        union = {q: any(cells[(backbone, o, 0)][q]["exact"] for o in others) for q in qids}
        for name, solved in [(o, {q: cells[(backbone, o, 0)][q]["exact"] for q in qids}) for o in others] + [
            ("union of the others", union)
        ]:
            counts = overlap[(backbone, name)]
            assert counts["a_only"] == sum(a[q]["exact"] and not solved[q] for q in qids)
            assert counts["b_only"] == sum(solved[q] and not a[q]["exact"] for q in qids)
            assert counts["both"] + counts["neither"] + counts["a_only"] + counts["b_only"] == len(qids)

    # Repeatability: agreement of root-step predictions between realizations 0 and 1.
    for entry in report["repeatability"]:
        r0, r1 = (
            cells[(entry["backbone"], entry["method"], 0)],
            cells[(entry["backbone"], entry["method"], 1)],
        )
        agree = sum(r0[q]["step"] is not None and r0[q]["step"] == r1[q]["step"] for q in qids)
        assert entry["agreement"][0]["agree"] == agree
        assert entry["mean_agreement"] == pytest.approx(agree / len(qids))
        values = [
            m["step_acc"]  # the headline aggregate: pooled, as the sample's sources differ in size
            for m in report["metrics"]
            if (m["backbone"], m["method"]) == (entry["backbone"], entry["method"])
        ]
        assert entry["metrics"]["step_acc"]["range"] == pytest.approx(max(values) - min(values))


def test_cost_json_reconciles_with_the_calls_table(demo_db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cost = _json(capsys, ["cost", "--db", str(demo_db), "--json"])
    rows = cost["rows"]
    chat = {"sim-deepseek", "sim-gpt", "sim-kimi", "sim-qwen"}
    # The demo's local backbone (SOAP on the random tiny model) reads a model: its passes cost no USD.
    assert {row["backbone"] for row in rows} == chat | {"tiny-random-local"}
    assert all(row["cost_usd"] == 0 for row in rows if row["backbone"] not in chat)
    for row in (row for row in rows if row["backbone"] in chat):
        key = (row["backbone"], row["method"], row["stage"])
        sent = _table(
            demo_db,
            "SELECT * FROM calls WHERE backbone = ? AND method = ? AND stage = ? AND status != 'cached'",
            key,
        )
        every = _table(demo_db, "SELECT * FROM calls WHERE backbone = ? AND method = ? AND stage = ?", key)
        assert row["attempts"] == len(every)
        assert row["calls"] == sum(r["attempt"] == 1 for r in every)
        assert row["length_retries"] == sum(r["status"] == "length" for r in every)
        assert row["rate_limited"] == sum(r["status"] == "rate_limited" for r in every)
        for field in ("prompt_tokens", "cached_tokens", "completion_tokens", "reasoning_tokens"):
            assert row[field] == sum(r[field] for r in sent)
        assert row["cost_usd"] == pytest.approx(sum(r["cost_usd"] for r in sent))
        assert row["items"] == len({r["item_id"] for r in every})
        method_items = _table(
            demo_db,
            "SELECT count(DISTINCT item_id) AS n FROM calls WHERE backbone = ? AND method = ?",
            key[:2],
        )[0]["n"]
        assert method_items == 20  # 10 trajectories x 2 realizations
        assert row["usd_per_trajectory"] == pytest.approx(row["cost_usd"] / method_items)
        latencies = sorted(r["latency_ms"] for r in sent if r["latency_ms"] is not None)
        # A stage every call of which was served from the cache (an RCTA ablation's Stage I) has no latency.
        p95 = latencies[math.ceil(0.95 * len(latencies)) - 1] if latencies else None
        assert row["latency_p95_ms"] == p95
    # The demo's features show up where they should: 429s on sim-deepseek/kimi, length retries on sim-qwen.
    by_key = {(row["backbone"], row["method"], row["stage"]): row for row in rows}
    qwen = by_key[("sim-qwen", "all-at-once", "attribution")]
    assert qwen["length_retries"] == 20 and qwen["cost_usd"] == 0
    assert sum(row["rate_limited"] for row in rows if row["backbone"] == "sim-deepseek") > 0
    total = _table(demo_db, "SELECT sum(cost_usd) AS usd FROM calls WHERE status != 'cached'")[0]["usd"]
    assert sum(row["cost_usd"] for row in rows) == pytest.approx(total)
    # sim-qwen's managed replicas: 2 GPUs at $2.5 an hour for the seconds they were held, split by tokens.
    (served,) = cost["served_by"]
    stopped = json.loads(
        _table(demo_db, "SELECT detail_json FROM run_events WHERE kind = 'replicas_stopped'")[0][
            "detail_json"
        ]
    )
    assert served["backbone"] == "sim-qwen" and served["replicas"] == 2
    assert served["gpu_usd"] == pytest.approx(stopped["held_s"] * 2 * 2.5 / 3600)
    qwen_rows = [row for row in rows if row["backbone"] == "sim-qwen"]
    assert sum(row["gpu_usd"] for row in qwen_rows) == pytest.approx(served["gpu_usd"])
    tokens = sum(row["prompt_tokens"] + row["completion_tokens"] for row in qwen_rows)
    assert qwen["gpu_usd"] == pytest.approx(
        served["gpu_usd"] * (qwen["prompt_tokens"] + qwen["completion_tokens"]) / tokens
    )
    assert all(row["gpu_usd"] == 0 for row in rows if row["backbone"] != "sim-qwen")


def test_report_text_and_html_page_from_the_demo(
    demo_db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    page = tmp_path / "report.html"
    assert main(["report", "--db", str(demo_db), "--html", str(page), "--resamples", "500"]) == 0
    text = capsys.readouterr().out
    assert "simulated" in text.lower()
    for backbone in ("sim-deepseek", "sim-gpt", "sim-kimi", "sim-qwen"):
        assert backbone in text
    html = page.read_text(encoding="utf-8")
    images = re.findall(r"data:image/png;base64,([A-Za-z0-9+/=]+)", html)
    assert len(images) == 3
    assert all(base64.b64decode(image).startswith(b"\x89PNG") for image in images)
    assert "simulated" in html.lower()
    assert not re.search(r"(src|href)=[\"']https?://", html)


def test_export_then_score_reproduces_the_leaderboard_entry(
    methods_db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "submission"
    assert (
        main(
            [
                "export",
                "--db",
                str(methods_db),
                "--run",
                "two",
                "--backbone",
                "beta",
                "--method",
                "aao-plain",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    capsys.readouterr()
    lines = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert len(lines) == 10 and all(
        set(line) == {"question_ID", "predicted_role", "predicted_step"} for line in lines
    )
    labels = tmp_path / "labels.csv"
    with labels.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["question_ID", "source", "n_steps", "reference_role", "reference_step"])
        for row in _table(methods_db, "SELECT * FROM trajectories"):
            writer.writerow([row["qid"], row["source"], row["n_steps"], row["ref_role"], row["ref_step"]])
    scored = _json(capsys, ["score", str(out / "predictions.jsonl"), "--references", str(labels), "--json"])
    entry = json.loads((out / "leaderboard.json").read_text())
    fields = (
        "n",
        "role_correct",
        "root_exact_correct",
        "root_within_5_correct",
        "root_mae",
        "valid_step_n",
        "failed_n",
        "by_benchmark",
    )
    assert {f: scored[f] for f in fields} == {f: entry[f] for f in fields}
    outcomes = _outcomes(methods_db)[("beta", "aao-plain", 0)]
    assert entry["root_exact_correct"] == sum(o["exact"] for o in outcomes.values())
    assert entry["simulated"] is True and entry["method"] == "aao-plain"


def test_commands_name_what_is_missing(
    demo_db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["report", "--db", str(tmp_path / "none.db")]) == 2
    assert "no such results database" in capsys.readouterr().err
    assert main(["cost", "--db", str(demo_db), "--run", "nope"]) == 2
    assert "no run named 'nope' (runs: 'demo')" in capsys.readouterr().err
    assert (
        main(["export", "--db", str(demo_db), "--backbone", "x", "--method", "y", "--out", str(tmp_path)])
        == 2
    )
    assert "--backbone: run 'demo' has no backbone 'x' (backbones: 'sim-deepseek'" in capsys.readouterr().err
    assert main(["report", "--db", str(demo_db), "--reference", "nope"]) == 2
    assert "--reference: run 'demo' has no method 'nope' (methods: " in capsys.readouterr().err


def test_recall_diagnostics_count_reference_roots_in_each_stored_set(
    methods_db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "copy.db"
    db.write_bytes(methods_db.read_bytes())
    references = {row["qid"]: row["ref_step"] for row in _table(db, "SELECT qid, ref_step FROM trajectories")}
    qids = sorted(references)
    # Hand-made diagnostics for alpha/aao r0: roots of the first 6 qids among the base candidates, of the first 4
    # among the excerpts, of the first 1 in the cited evidence; the rest list other steps only.
    connection = sqlite3.connect(db)
    with connection:
        for position, qid in enumerate(qids):
            root = references[qid]

            def ids(limit: int, root: int = root, position: int = position) -> list[int]:
                return [root] if position < limit else [root + 1000]

            diagnostics = {"base_candidate_ids": ids(6), "excerpt_ids": ids(4), "evidence_ids": ids(1)}
            connection.execute(
                "UPDATE predictions SET output_json = ? WHERE backbone = 'alpha' AND method = 'aao' "
                "AND realization = 0 AND qid = ?",
                (json.dumps({"diagnostics": diagnostics}), qid),
            )
    connection.close()
    report = _json(capsys, ["report", "--db", str(db), "--json", "--resamples", "10"])
    assert report["recall"] == [
        {
            "backbone": "alpha",
            "method": "aao",
            "n": 10,
            "base_candidate": 0.6,
            "excerpt": 0.4,
            "evidence": 0.1,
        }
    ]
    assert main(["report", "--db", str(db), "--resamples", "10"]) == 0
    text = capsys.readouterr().out
    assert "Recall diagnostics" in text and "60.0" in text
