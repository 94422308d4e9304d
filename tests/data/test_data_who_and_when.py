"""The loaders against the real Who&When release: every file loads, with the numbers its README states."""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from pathlib import Path

from rcarun.data import iter_dataset, load_trajectory_file

HAND_CRAFTED_AGENTS = {"human", "Orchestrator", "WebSurfer", "Assistant", "FileSurfer", "ComputerTerminal"}


def test_every_file_loads_with_the_documented_counts(who_and_when: Path) -> None:
    records = list(iter_dataset(who_and_when))

    assert Counter(r.trajectory.source for r in records) == {"algorithm_generated": 126, "hand_crafted": 20}
    assert all(r.reference is not None for r in records)
    assert sum(r.trajectory.n_steps for r in records if r.trajectory.source == "algorithm_generated") == 1099
    assert sum(r.trajectory.n_steps for r in records if r.trajectory.source == "hand_crafted") == 1135
    assert max(r.trajectory.n_steps for r in records if r.trajectory.source == "algorithm_generated") == 10
    assert max(r.trajectory.n_steps for r in records if r.trajectory.source == "hand_crafted") == 130


def test_qids_are_unique_although_question_ids_repeat_across_sources(who_and_when: Path) -> None:
    records = list(iter_dataset(who_and_when))
    qids = [r.trajectory.qid for r in records]
    assert len(set(qids)) == 146

    question_ids = Counter(
        json.loads(file.read_bytes())["question_ID"] for file in who_and_when.glob("*/*.json")
    )
    assert sum(1 for count in question_ids.values() if count > 1) == 13  # why question_ID cannot be the qid


def test_files_come_in_natural_numeric_order(who_and_when: Path) -> None:
    qids = [r.trajectory.qid for r in iter_dataset(who_and_when)]
    assert qids[:3] == ["algorithm_generated/1", "algorithm_generated/2", "algorithm_generated/3"]
    assert qids[125:128] == ["algorithm_generated/126", "hand_crafted/1", "hand_crafted/2"]
    assert qids[-1] == "hand_crafted/20"


def test_hand_crafted_roles_normalise_to_magentic_one_agents(who_and_when: Path) -> None:
    record = load_trajectory_file(who_and_when / "hand_crafted" / "14.json", "hand_crafted")
    trajectory = record.trajectory

    assert trajectory.agents == ("human", "Orchestrator", "WebSurfer", "FileSurfer", "ComputerTerminal")
    by_role = {step.role: step.agent for step in trajectory.steps}
    assert by_role["Orchestrator (-> WebSurfer)"] == "Orchestrator"
    assert by_role["Orchestrator (-> ComputerTerminal)"] == "Orchestrator"
    assert by_role["Orchestrator (thought)"] == "Orchestrator"
    assert by_role["Orchestrator (termination condition)"] == "Orchestrator"
    assert by_role["ComputerTerminal"] == "ComputerTerminal"

    for other in iter_dataset(who_and_when):
        if other.trajectory.source == "hand_crafted":
            assert set(other.trajectory.agents) <= HAND_CRAFTED_AGENTS
            assert other.trajectory.steps[0].agent == "human"


def test_algorithm_generated_agent_is_the_name_and_role_stays_raw(who_and_when: Path) -> None:
    record = load_trajectory_file(who_and_when / "algorithm_generated" / "12.json", "algorithm_generated")
    trajectory = record.trajectory
    raw = json.loads((who_and_when / "algorithm_generated" / "12.json").read_bytes())

    assert [s.agent for s in trajectory.steps] == [item["name"] for item in raw["history"]]
    assert {s.role for s in trajectory.steps} <= {"user", "assistant"}
    assert trajectory.task == raw["question"]
    assert trajectory.qid == "algorithm_generated/12"
    assert (
        trajectory.sha256
        == hashlib.sha256((who_and_when / "algorithm_generated/12.json").read_bytes()).hexdigest()
    )


def test_references_parse_from_strings_and_noisy_labels_are_kept(who_and_when: Path) -> None:
    hand = load_trajectory_file(who_and_when / "hand_crafted" / "20.json", "hand_crafted")
    assert hand.reference is not None
    assert (hand.reference.role, hand.reference.step) == ("WebSurfer", 3)
    assert hand.trajectory.steps[3].agent == "Orchestrator"  # noisy label, not repaired
    assert hand.reference.rationale.strip() != ""

    algo = load_trajectory_file(who_and_when / "algorithm_generated" / "14.json", "algorithm_generated")
    assert algo.reference is not None
    assert (algo.reference.role, algo.reference.step) == ("Culinary_Awards_Expert", 2)
    assert algo.trajectory.steps[2].agent == "Computer_terminal"

    first = load_trajectory_file(who_and_when / "algorithm_generated" / "1.json", "algorithm_generated")
    assert first.reference is not None and first.reference.step == 0
