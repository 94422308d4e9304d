"""`rcarun score` on a hand-made submission and labels file: the counts worked out by hand below."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rcarun.cli import main

LABELS = """question_ID,source,n_steps,reference_role,reference_step
q1,A,10,DiagnostAgent (-> ActionAgent),3
q2,A,10,Planner,0
q3,A,20,Coder,10
q4,B,8,WebSurfer,7
q5,B,8,Orchestrator,2
q6,B,30,Planner (Review),12
"""

# q1: handoff-form reference matched by the bare sender; exact.        role 1, exact 1, ±5 1, |err| 0
# q2: role matches after trim/casefold; step "abc" does not parse.     role 1, invalid step
# q3: role right; step 16 is 6 away.                                   role 1, exact 0, ±5 0, |err| 6
# q4: step 8 is out of range for 8 steps; wrong role.                  role 0, invalid step
# q5: no line at all.                                                  everything wrong, stays in n
# q6: "Planner" is not "Planner (Review)"; step 7 is 5 away.           role 0, exact 0, ±5 1, |err| 5
# plus a line for an unknown qid, a repeated q1 (ignored) and a line that is not JSON (dropped).
PREDICTIONS = [
    '{"question_ID": "q1", "predicted_role": "DiagnostAgent", "predicted_step": 3}',
    '{"question_ID": "q2", "predicted_role": " planner ", "predicted_step": "abc"}',
    '{"question_ID": "q3", "predicted_role": "Coder", "predicted_step": 16}',
    '{"question_ID": "q4", "predicted_role": "Orchestrator", "predicted_step": 8}',
    '{"question_ID": "q6", "predicted_role": "Planner", "predicted_step": 7}',
    '{"question_ID": "zz", "predicted_role": "Planner", "predicted_step": 1}',
    '{"question_ID": "q1", "predicted_role": "Nobody", "predicted_step": 0}',
    '{"question_ID": "q2", "predicted_role": ',
]


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    labels = tmp_path / "labels.csv"
    labels.write_text(LABELS)
    predictions = tmp_path / "predictions.jsonl"
    predictions.write_text("\n".join(PREDICTIONS) + "\n")
    return predictions, labels


def test_counts_match_the_hand_worked_ones(
    files: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    predictions, labels = files
    assert main(["score", str(predictions), "--references", str(labels), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert {k: result[k] for k in ("n", "role_correct", "root_exact_correct", "root_within_5_correct")} == {
        "n": 6,
        "role_correct": 3,
        "root_exact_correct": 1,
        "root_within_5_correct": 2,
    }
    assert (result["valid_step_n"], result["failed_n"]) == (3, 3)
    assert result["root_mae"] == pytest.approx((0 + 6 + 5) / 3)
    assert result["by_benchmark"] == {
        "A": {"n": 3, "role_correct": 3, "root_exact_correct": 1, "root_within_5_correct": 1},
        "B": {"n": 3, "role_correct": 0, "root_exact_correct": 0, "root_within_5_correct": 1},
    }
    assert result["missing"] == ["q5"]
    assert result["unknown"] == ["zz"]
    assert result["duplicates"] == [{"qid": "q1", "line": 7, "first_line": 1}]
    assert len(result["problems"]) == 1 and "line 8" in result["problems"][0]
    pooled, macro = result["accuracy"]["pooled"], result["accuracy"]["macro"]
    assert pooled["agent_acc"] == pytest.approx(3 / 6) and pooled["step_pm5"] == pytest.approx(2 / 6)
    assert macro["agent_acc"] == pytest.approx((3 / 3 + 0 / 3) / 2)
    assert pooled["coverage"] == pytest.approx(3 / 6)  # q1, q3, q6: a role and a valid step


def test_ablation_rule_keeps_handoff_suffixes(
    files: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    predictions, labels = files
    assert main(["score", str(predictions), "--references", str(labels), "--json", "--keep-handoff"]) == 0
    assert json.loads(capsys.readouterr().out)["role_correct"] == 2  # q1 no longer matches


def test_text_output_lists_every_problem(
    files: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    predictions, labels = files
    assert main(["score", str(predictions), "--references", str(labels)]) == 0
    out = capsys.readouterr().out
    assert "missing predictions (scored as errors): 1: q5" in out
    assert "unknown qids (ignored): 1: zz" in out
    assert "duplicate: q1 on line 7 (line 1 was scored)" in out
    assert "n 6: role 3, root exact 1, root ±5 2, valid steps 3, failed 3, MAE 3.67" in out


def test_references_from_a_dataset_directory(
    who_and_when: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Predict every Who&When label exactly: all counts equal n (noisy labels included, never repaired).
    from rcarun.data import iter_dataset

    lines = []
    for record in iter_dataset(who_and_when):
        assert record.reference is not None
        lines.append(
            json.dumps(
                {
                    "question_ID": record.trajectory.qid,
                    "predicted_role": record.reference.role,
                    "predicted_step": record.reference.step,
                }
            )
        )
    predictions = tmp_path / "predictions.jsonl"
    predictions.write_text("\n".join(lines) + "\n")
    assert main(["score", str(predictions), "--references", str(who_and_when), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["n"] == result["role_correct"] == result["root_exact_correct"] == 146
    assert result["root_mae"] == 0 and result["missing"] == []
