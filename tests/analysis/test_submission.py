"""Leaderboard submissions, labels files and leaderboard entries, on small files written in tmp_path."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest

from rcarun.analysis.scoring import Expected, Prediction, score_items
from rcarun.analysis.submission import (
    LABEL_COLUMNS,
    DuplicateLine,
    leaderboard_entry,
    load_labels,
    load_predictions_jsonl,
    references_from_dataset,
    score_submission,
    write_predictions_jsonl,
)
from rcarun.errors import DataError


def _line(qid: str, role: object, step: object) -> str:
    return json.dumps({"question_ID": qid, "predicted_role": role, "predicted_step": step})


def _write_lines(path: Path, lines: list[str | bytes]) -> Path:
    path.write_bytes(b"".join((line if isinstance(line, bytes) else line.encode()) + b"\n" for line in lines))
    return path


# --- reading a submission ------------------------------------------------------------------------------


def test_load_predictions_keeps_good_lines_and_reports_the_rest(tmp_path: Path) -> None:
    file = _write_lines(
        tmp_path / "predictions.jsonl",
        [
            _line("a__001", "Planner", 3),  # 1
            '{"question_ID": "a__002", ',  # 2: truncated JSON
            "[1, 2]",  # 3: not an object
            json.dumps({"predicted_role": "X", "predicted_step": 1}),  # 4: no question_ID
            "",  # 5: blank, skipped silently
            _line("a__001", "Other", 9),  # 6: duplicate, dropped
            _line("b__001", "Coder", "abc"),  # 7: kept, step noted
            json.dumps({"question_ID": " b__002 ", "predicted_step": "2"}),  # 8: kept, role noted
            b'{"question_ID": "b__003", "predicted_role": "\xff"}',  # 9: not UTF-8
            _line("b__004", "Coder", 3.5),  # 10: kept, step noted
        ],
    )
    loaded = load_predictions_jsonl(file)
    assert list(loaded.predictions) == ["a__001", "b__001", "b__002", "b__004"]
    assert loaded.predictions["a__001"] == Prediction(role="Planner", step=3)  # the first line wins
    assert loaded.predictions["b__001"] == Prediction(role="Coder", step="abc")
    assert loaded.predictions["b__002"] == Prediction(role=None, step="2")  # qid stripped
    assert loaded.predictions["b__004"] == Prediction(role="Coder", step=3.5)
    assert dict(loaded.lines) == {"a__001": 1, "b__001": 7, "b__002": 8, "b__004": 10}
    assert loaded.duplicates == (DuplicateLine(qid="a__001", line=6, first_line=1),)
    assert [problem.record for problem in loaded.problems] == ["line 2", "line 3", "line 4", "line 9"]
    assert all(problem.path == str(file) for problem in loaded.problems)
    assert loaded.problems[2].field == "question_ID"
    assert "not valid JSON" in str(loaded.problems[0])
    assert "not UTF-8" in str(loaded.problems[3])
    assert [(note.record, note.field) for note in loaded.notes] == [
        ("b__001 (line 7)", "predicted_step"),
        ("b__002 (line 8)", "predicted_role"),
        ("b__004 (line 10)", "predicted_step"),
    ]


def test_unreadable_submission_file_raises(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="cannot read"):
        load_predictions_jsonl(tmp_path / "absent.jsonl")


# --- labels --------------------------------------------------------------------------------------------

_LABELS: list[dict[str, Any]] = [
    {
        "question_ID": "s__001",
        "source": "swe",
        "n_steps": 100,
        "reference_role": "DiagnostAgent (-> ActionAgent)",
        "reference_step": 10,
    },
    {
        "question_ID": "s__002",
        "source": "swe",
        "n_steps": 50,
        "reference_role": "ActionAgent",
        "reference_step": 20,
    },
    {
        "question_ID": "s__003",
        "source": "swe",
        "n_steps": 30,
        "reference_role": "JudgeAgent",
        "reference_step": 0,
    },
    {
        "question_ID": "t__001",
        "source": "tp",
        "n_steps": 40,
        "reference_role": "Planner, Inc",
        "reference_step": 5,
    },
    {
        "question_ID": "t__002",
        "source": "tp",
        "n_steps": 60,
        "reference_role": "Planner (Review)",
        "reference_step": 30,
    },
]


def _write_csv(path: Path, rows: list[dict[str, Any]], columns: tuple[str, ...] = LABEL_COLUMNS) -> Path:
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(columns), extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    return path


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    return _write_lines(path, [json.dumps(row) for row in rows])


def _expected_labels() -> list[Expected]:
    return [
        Expected(
            qid=row["question_ID"],
            source=row["source"],
            n_steps=row["n_steps"],
            ref_role=row["reference_role"],
            ref_step=row["reference_step"],
        )
        for row in _LABELS
    ]


def test_load_labels_reads_csv_and_jsonl_alike(tmp_path: Path) -> None:
    from_csv = load_labels(_write_csv(tmp_path / "labels.csv", _LABELS))
    from_jsonl = load_labels(_write_jsonl(tmp_path / "labels.jsonl", _LABELS))
    assert from_csv == _expected_labels()  # "Planner, Inc" survives CSV quoting; ints parsed from text
    assert from_jsonl == _expected_labels()
    assert all(item.roles is None for item in from_csv)


def test_load_labels_accepts_integer_strings_in_jsonl(tmp_path: Path) -> None:
    row = dict(_LABELS[0], n_steps="100", reference_step=" 10 ")
    assert load_labels(_write_jsonl(tmp_path / "labels.jsonl", [row])) == _expected_labels()[:1]


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"n_steps": "ten"}, "n_steps"),
        ({"n_steps": 0, "reference_step": 0}, "n_steps"),
        ({"reference_step": 30}, "reference_step"),  # n_steps is 30: 0..29 are valid
        ({"reference_step": -1}, "reference_step"),
        ({"reference_step": 2.5}, "reference_step"),
        ({"reference_role": ""}, "reference_role"),
        ({"reference_role": "(-> Coder)"}, "reference_role"),  # empty once normalised
        ({"source": " "}, "source"),
        ({"question_ID": ""}, "question_ID"),
    ],
)
@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_bad_label_rows_raise_naming_file_record_and_field(
    tmp_path: Path, change: dict[str, Any], field: str, suffix: str
) -> None:
    rows = [_LABELS[0], dict(_LABELS[2], **change)]
    path = tmp_path / f"labels{suffix}"
    if suffix == ".csv":
        _write_csv(path, rows)
    else:
        _write_jsonl(path, rows)
    with pytest.raises(DataError) as caught:
        load_labels(path)
    assert caught.value.field == field
    assert caught.value.path == str(path)
    # the bad row is the file's third line in CSV (after the header) and its second line in JSONL
    assert ("line 3" if suffix == ".csv" else "line 2") in caught.value.record


def test_duplicate_label_qid_raises(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "labels.jsonl", [_LABELS[0], _LABELS[1], _LABELS[0]])
    with pytest.raises(DataError, match="duplicate") as caught:
        load_labels(path)
    assert (caught.value.record, caught.value.field) == ("line 3", "question_ID")


def test_csv_missing_column_raises(tmp_path: Path) -> None:
    columns = tuple(column for column in LABEL_COLUMNS if column != "source")
    path = _write_csv(tmp_path / "labels.csv", _LABELS, columns)
    with pytest.raises(DataError) as caught:
        load_labels(path)
    assert (caught.value.record, caught.value.field) == ("header", "source")


def test_labels_need_a_known_extension_and_some_rows(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"\.csv or \.jsonl"):
        load_labels(_write_jsonl(tmp_path / "labels.txt", _LABELS))
    with pytest.raises(DataError, match="no labels"):
        load_labels(_write_lines(tmp_path / "empty.jsonl", [""]))
    with pytest.raises(DataError, match="cannot read"):
        load_labels(tmp_path / "absent.csv")
    bad_json = _write_lines(tmp_path / "bad.jsonl", [json.dumps(_LABELS[0]), "{oops"])
    with pytest.raises(DataError, match="not valid JSON") as caught:
        load_labels(bad_json)
    assert caught.value.record == "line 2"


# --- references from a dataset ---------------------------------------------------------------------------


def _longrca_record(qid: str, **label: Any) -> dict[str, Any]:
    return {
        "question_ID": qid,
        "history": [
            {"step": 0, "name": "human", "role": "user", "content": "fix it"},
            {"step": 1, "name": "DiagnostAgent (-> ActionAgent)", "role": "assistant", "content": "edit"},
            {"step": 2, "name": "ActionAgent", "role": "assistant", "content": "done"},
        ],
        **label,
    }


def test_references_from_dataset_reads_roles_and_reports_skips(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    for source, name, record in [
        ("swe", "swe__001", _longrca_record("swe__001", mistake_agent="ActionAgent", mistake_step=2)),
        ("swe", "swe__002", _longrca_record("swe__002")),  # unlabelled: skipped and reported
        ("swe", "swe__003", _longrca_record("swe__003", mistake_agent="ActionAgent", mistake_step=7)),  # bad
        ("tp", "tp__001", _longrca_record("tp__001", mistake_agent="DiagnostAgent", mistake_step=1)),
    ]:
        (root / source).mkdir(parents=True, exist_ok=True)
        (root / source / f"{name}.json").write_text(json.dumps(record))
    references = references_from_dataset(root)
    roles = frozenset({"human", "DiagnostAgent (-> ActionAgent)", "ActionAgent"})
    assert references.expected == [
        Expected("swe__001", "swe", 3, "ActionAgent", 2, roles),
        Expected("tp__001", "tp", 3, "DiagnostAgent", 1, roles),
    ]
    assert [problem.record.split(" ")[0] for problem in references.problems] == ["swe__002", "swe__003"]
    assert "no reference" in str(references.problems[0])
    assert references.problems[1].field == "mistake_step"
    # the role set drives coverage: the bare sender of a recorded handoff form is a recorded role
    [covered, not_recorded] = score_items(
        references.expected,
        {"swe__001": Prediction("DiagnostAgent", 2), "tp__001": Prediction("Planner", 1)},
    )
    assert covered.covered and not covered.role_correct
    assert not not_recorded.covered and not_recorded.step_exact


# --- scoring a submission and the leaderboard entry ------------------------------------------------------
#
# Expected (labels above): s__001 DiagnostAgent (-> ActionAgent)@10 of 100, s__002 ActionAgent@20 of 50,
# s__003 JudgeAgent@0 of 30, t__001 "Planner, Inc"@5 of 40, t__002 "Planner (Review)"@30 of 60.
# Submission lines:
#   1 s__001 DiagnostAgent@10   role ✓ (handoff suffix stripped) exact ✓ ±5 ✓ err 0
#   2 broken JSON               dropped
#   3 s__002 ActionAgent@26     role ✓ exact ✗ ±5 ✗ (err 6)
#   4 t__001 Coder@0            role ✗ exact ✗ ±5 ✓ (err 5)
#   5 s__001 JudgeAgent@99      duplicate, dropped (the first line stands)
#   6 t__002 Planner@"abc"      role ✗ ("(Review)" survives), step invalid
#   7 zz__999 X@1               unknown
#   s__003 has no line: missing, an error for every target.
# n 5, role 2, exact 1, within-5 2 (s__001, t__001), valid 3, failed 2, MAE (0+6+5)/3 = 11/3.
# swe: n 3, role 2, exact 1, within 1; tp: n 2, role 0, exact 0, within 1.


def _submission(tmp_path: Path) -> Path:
    return _write_lines(
        tmp_path / "predictions.jsonl",
        [
            _line("s__001", "DiagnostAgent", 10),
            '{"question_ID": "s__002"',
            _line("s__002", "ActionAgent", 26),
            _line("t__001", "Coder", 0),
            _line("s__001", "JudgeAgent", 99),
            _line("t__002", "Planner", "abc"),
            _line("zz__999", "X", 1),
        ],
    )


def test_score_submission_counts_and_reports(tmp_path: Path) -> None:
    labels = load_labels(_write_csv(tmp_path / "labels.csv", _LABELS))
    result = score_submission(load_predictions_jsonl(_submission(tmp_path)), labels)
    assert result.entry == {
        "n": 5,
        "role_correct": 2,
        "root_exact_correct": 1,
        "root_within_5_correct": 2,
        "root_mae": pytest.approx(11 / 3),
        "valid_step_n": 3,
        "failed_n": 2,
        "by_benchmark": {
            "swe": {"n": 3, "role_correct": 2, "root_exact_correct": 1, "root_within_5_correct": 1},
            "tp": {"n": 2, "role_correct": 0, "root_exact_correct": 0, "root_within_5_correct": 1},
        },
    }
    assert result.missing == ("s__003",)
    assert result.unknown == ("zz__999",)
    assert result.duplicates == (DuplicateLine(qid="s__001", line=5, first_line=1),)
    assert [problem.record for problem in result.problems] == ["line 2"]
    assert [(note.record, note.field) for note in result.notes] == [("t__002 (line 6)", "predicted_step")]
    assert [item.qid for item in result.items] == ["s__001", "s__002", "s__003", "t__001", "t__002"]
    assert not result.clean


def test_score_submission_under_the_ablation_role_rule(tmp_path: Path) -> None:
    labels = load_labels(_write_csv(tmp_path / "labels.csv", _LABELS))
    result = score_submission(load_predictions_jsonl(_submission(tmp_path)), labels, keep_handoff=True)
    # "DiagnostAgent" no longer matches "DiagnostAgent (-> ActionAgent)": only s__002 is right
    assert result.entry["role_correct"] == 1
    assert result.entry["by_benchmark"]["swe"]["role_correct"] == 1


def test_leaderboard_entry_meets_the_validator_contract(tmp_path: Path) -> None:
    labels = load_labels(_write_csv(tmp_path / "labels.csv", _LABELS))
    entry = score_submission(load_predictions_jsonl(_submission(tmp_path)), labels).entry
    assert set(entry) == {
        "n",
        "role_correct",
        "root_exact_correct",
        "root_within_5_correct",
        "root_mae",
        "valid_step_n",
        "failed_n",
        "by_benchmark",
    }
    assert entry["valid_step_n"] + entry["failed_n"] == entry["n"]
    assert entry["root_within_5_correct"] >= entry["root_exact_correct"]
    per_source = entry["by_benchmark"].values()
    assert sum(counts["root_exact_correct"] for counts in per_source) == entry["root_exact_correct"]
    assert sum(counts["n"] for counts in per_source) == entry["n"]
    assert list(entry["by_benchmark"]) == sorted(entry["by_benchmark"])
    json.dumps(entry)  # plain JSON, ready to publish


def test_leaderboard_mae_is_the_plain_mean_and_none_without_valid_steps() -> None:
    # x: errors 0 and 10 (MAE 5); y: error 2 and an invalid step (MAE 2). The leaderboard's plain mean is
    # (0+10+2)/3 = 4; the paper's source-weighted MAE would be (2·5 + 2·2)/4 = 3.5.
    expected = [
        Expected("x1", "x", 50, "A", 20),
        Expected("x2", "x", 50, "A", 20),
        Expected("y1", "y", 50, "A", 20),
        Expected("y2", "y", 50, "A", 20),
    ]
    predictions = {
        "x1": Prediction("A", 20),
        "x2": Prediction("A", 30),
        "y1": Prediction("A", 22),
        "y2": Prediction("A", None),
    }
    entry = leaderboard_entry(score_items(expected, predictions))
    assert entry["root_mae"] == pytest.approx(4.0)
    assert (entry["valid_step_n"], entry["failed_n"]) == (3, 1)
    assert leaderboard_entry(score_items(expected, {}))["root_mae"] is None


def test_clean_submission(tmp_path: Path) -> None:
    labels = load_labels(_write_jsonl(tmp_path / "labels.jsonl", _LABELS))
    file = _write_lines(
        tmp_path / "predictions.jsonl",
        [_line(row["question_ID"], row["reference_role"], row["reference_step"]) for row in _LABELS],
    )
    result = score_submission(load_predictions_jsonl(file), labels)
    assert result.clean
    assert result.entry["root_exact_correct"] == result.entry["role_correct"] == 5
    assert result.entry["root_mae"] == 0.0


# --- writing a submission ------------------------------------------------------------------------------


def test_write_predictions_round_trips_the_scores(tmp_path: Path) -> None:
    expected = [Expected(f"t__{i}", "tp", 20, "Planner", 4) for i in (1, 2, 10, 11, 12)]
    predictions = {
        "t__10": Prediction("Planner", 4),
        "t__2": Prediction("Planner", " 4 "),  # integer text: written as an int
        "t__11": Prediction("Planner", 4, abstained=True),  # right: scored on its fields (main rule)
        "t__1": Prediction(None, 3.5),
        "t__12": Prediction("Coder", 25),  # out of range, but an int: written as is
    }
    path = tmp_path / "out" / "predictions.jsonl"
    path.parent.mkdir()
    assert write_predictions_jsonl(path, predictions) == 5
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    assert rows == [
        {"question_ID": "t__1", "predicted_role": "", "predicted_step": -1},
        {"question_ID": "t__2", "predicted_role": "Planner", "predicted_step": 4},
        {"question_ID": "t__10", "predicted_role": "Planner", "predicted_step": 4},
        {"question_ID": "t__11", "predicted_role": "Planner", "predicted_step": 4},
        {"question_ID": "t__12", "predicted_role": "Coder", "predicted_step": 25},
    ]
    reread = load_predictions_jsonl(path)
    assert reread.problems == () and reread.duplicates == ()

    def outcomes(scores: list[Any]) -> list[tuple[object, ...]]:
        return [(s.qid, s.role_correct, s.step_valid, s.step_exact, s.step_pm5, s.abs_err) for s in scores]

    original = score_items(expected, predictions)
    assert outcomes(score_items(expected, reread.predictions)) == outcomes(original)
    assert [s.step_exact for s in original] == [False, True, True, True, False]

    # Under the component rule the abstention is an error for every target, and the file says so.
    errors = tmp_path / "out" / "errors.jsonl"
    write_predictions_jsonl(errors, predictions, abstentions="error")
    rows = [json.loads(line) for line in errors.read_text(encoding="utf-8").splitlines()]
    assert rows[3] == {"question_ID": "t__11", "predicted_role": "", "predicted_step": -1}
    strict = score_items(expected, predictions, abstentions="error")
    assert outcomes(score_items(expected, load_predictions_jsonl(errors).predictions)) == outcomes(strict)
    assert [s.step_exact for s in strict] == [False, True, True, False, False]
