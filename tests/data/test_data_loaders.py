"""Loaders on small real files in tmp_path: layouts, qids, labels, laziness and every kind of bad input."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rcarun.data import (
    Record,
    count_entries,
    iter_dataset,
    load_jsonl,
    load_trajectory_file,
    natural_sort_key,
)
from rcarun.errors import DataError

RecordWriter = Callable[..., Path]
Mutation = Callable[[dict[str, Any]], None]


def _longrca(
    qid: str, *, mistake_agent: str = "DiagnostAgent (-> ActionAgent)", mistake_step: int = 1
) -> dict[str, Any]:
    return {
        "question_ID": qid,
        "history": [
            {"step": 0, "name": "human", "role": "user", "content": "fix the bug"},
            {
                "step": 1,
                "name": "DiagnostAgent (-> ActionAgent)",
                "role": "assistant",
                "content": "edit foo.py",
            },
            {"step": 2, "name": "ActionAgent", "role": "assistant", "content": "done"},
            {"step": 3, "name": "Computer_terminal", "role": "user", "content": "exit code 1"},
        ],
        "mistake_agent": mistake_agent,
        "mistake_step": mistake_step,
        "mistake_reason": "wrong file",
    }


def _collect(path: Path) -> tuple[list[Record], list[DataError]]:
    problems: list[DataError] = []
    records = list(iter_dataset(path, strict=False, on_problem=problems.append))
    return records, problems


# --- good input -------------------------------------------------------------------------------------------


def test_longrca_file_keeps_question_id_handoff_names_and_int_steps(write_record: RecordWriter) -> None:
    file = write_record(_longrca("vitabench__007"), source="vitabench", name="vitabench__007")
    record = load_trajectory_file(file, "vitabench")

    trajectory = record.trajectory
    assert trajectory.qid == "vitabench__007"
    assert trajectory.source == "vitabench"
    # No question field: the task is the human's opening step, which stays step 0 of the log.
    assert (trajectory.task, trajectory.task_source) == ("fix the bug", "history[0]")
    assert trajectory.steps[0].content == "fix the bug" and trajectory.n_steps == 4
    assert trajectory.agents == (
        "human",
        "DiagnostAgent (-> ActionAgent)",
        "ActionAgent",
        "Computer_terminal",
    )
    assert [s.role for s in trajectory.steps] == ["user", "assistant", "assistant", "user"]
    assert trajectory.sha256 == hashlib.sha256(file.read_bytes()).hexdigest()
    assert record.reference is not None
    assert (record.reference.role, record.reference.step, record.reference.rationale) == (
        "DiagnostAgent (-> ActionAgent)",
        1,
        "wrong file",
    )


def test_reference_agent_matches_the_way_the_scorer_compares_roles(write_record: RecordWriter) -> None:
    # Only the handoff form is recorded; the plain sender name, in another case, still names a recorded agent.
    record = load_trajectory_file(write_record(_longrca("x__001", mistake_agent=" diagnostagent ")), "src")
    assert record.reference is not None
    assert record.reference.role == " diagnostagent "  # raw, never repaired


def test_who_and_when_shape_with_string_step_and_missing_reason(
    write_record: RecordWriter, good_record: dict[str, Any]
) -> None:
    good_record["mistake_step"] = "  2 "
    good_record["mistake_agent"] = "Coder"
    del good_record["mistake_reason"]
    record = load_trajectory_file(write_record(good_record, name="7"), "src")

    assert record.trajectory.qid == "src/7"
    assert record.trajectory.task == "How many?"
    assert record.trajectory.agents == ("human", "Planner", "Coder")
    assert record.reference is not None
    assert (record.reference.role, record.reference.step, record.reference.rationale) == ("Coder", 2, "")


def test_record_without_label_fields_has_no_reference(
    write_record: RecordWriter, good_record: dict[str, Any]
) -> None:
    for key in ("mistake_agent", "mistake_step", "mistake_reason"):
        del good_record[key]
    record = load_trajectory_file(write_record(good_record), "src")
    assert record.reference is None
    assert record.trajectory.n_steps == 3


def test_natural_order_of_files_and_sources(write_record: RecordWriter, good_record: dict[str, Any]) -> None:
    for source in ("src10", "src2"):
        for name in ("10", "9", "2", "1"):
            write_record(good_record, source=source, name=name)
    root = write_record(good_record, source="src2", name="100").parent.parent
    (root / "LICENSE").write_text("not a trajectory")
    (root / "src2" / "notes.txt").write_text("ignored")

    qids = [r.trajectory.qid for r in iter_dataset(root)]
    assert qids == [
        "src2/1", "src2/2", "src2/9", "src2/10", "src2/100",
        "src10/1", "src10/2", "src10/9", "src10/10",
    ]  # fmt: skip
    assert sorted(["10.json", "2.json", "a1", "A0"], key=natural_sort_key) == [
        "2.json",
        "10.json",
        "A0",
        "a1",
    ]


def test_jsonl_file_with_source_per_line(tmp_path: Path, good_record: dict[str, Any]) -> None:
    lines = [
        json.dumps({**good_record, "source": "algorithm_generated"}),
        "",
        json.dumps({**_longrca("vitabench__003"), "source": "vitabench"}),
        json.dumps({**good_record, "source": "hand_crafted", "qid": "hand_crafted/5"}),
    ]
    path = tmp_path / "all.jsonl"
    path.write_text("\n".join(lines) + "\r\n")

    records = list(load_jsonl(path))
    assert [(r.trajectory.qid, r.trajectory.source) for r in records] == [
        ("algorithm_generated/task-1", "algorithm_generated"),
        ("vitabench__003", "vitabench"),
        ("hand_crafted/5", "hand_crafted"),
    ]
    assert records[0].trajectory.sha256 == hashlib.sha256(lines[0].encode()).hexdigest()
    assert records[2].trajectory.sha256 == hashlib.sha256(lines[3].encode()).hexdigest()  # no "\r\n"
    assert [r.trajectory.qid for r in iter_dataset(path)] == [r.trajectory.qid for r in records]


def test_directory_of_jsonl_files(tmp_path: Path, good_record: dict[str, Any]) -> None:
    for part, source in (("part10", "b"), ("part2", "a")):
        (tmp_path / f"{part}.jsonl").write_text(json.dumps({**good_record, "source": source}) + "\n")
    assert [r.trajectory.qid for r in iter_dataset(tmp_path)] == ["a/task-1", "b/task-1"]


def test_iter_dataset_is_lazy(write_record: RecordWriter, good_record: dict[str, Any]) -> None:
    first = write_record(good_record, name="1")
    write_record(b"{broken", name="2")
    missing = first.parent / "nowhere"

    records = iter_dataset(first.parent.parent)
    assert next(records).trajectory.qid == "src/1"  # the broken file is not read yet
    with pytest.raises(DataError):
        next(records)
    iter_dataset(missing)  # no error until iterated


def test_non_strict_reports_problems_and_keeps_going(
    write_record: RecordWriter, good_record: dict[str, Any]
) -> None:
    write_record(good_record, name="1")
    write_record(b"not json", name="2")
    write_record({"history": []}, name="3")
    write_record(good_record, name="4")
    records, problems = _collect(write_record(good_record, name="5").parent.parent)

    assert [r.trajectory.qid for r in records] == ["src/1", "src/4", "src/5"]
    assert [(p.record, p.field) for p in problems] == [("src/2", ""), ("src/3", "history")]


def test_non_strict_needs_a_callback(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="on_problem"):
        iter_dataset(tmp_path, strict=False)


# --- bad input: one case per kind; the message names file, record and field --------------------------------


def _set(path: str, value: Any) -> Mutation:
    def mutate(record: dict[str, Any]) -> None:
        target: Any = record
        *parents, last = path.split(".")
        for key in parents:
            target = target[int(key)] if isinstance(target, list) else target[key]
        target[int(last) if isinstance(target, list) else last] = value

    return mutate


def _delete(path: str) -> Mutation:
    def mutate(record: dict[str, Any]) -> None:
        target: Any = record
        *parents, last = path.split(".")
        for key in parents:
            target = target[int(key)] if isinstance(target, list) else target[key]
        del target[last]

    return mutate


def _all(*mutations: Mutation) -> Mutation:
    def mutate(record: dict[str, Any]) -> None:
        for each in mutations:
            each(record)

    return mutate


BAD_RECORDS: list[tuple[str, Mutation, str, str]] = [
    ("history missing", _delete("history"), "history", "missing"),
    ("history not a list", _set("history", {"0": "hi"}), "history", "expected a list of steps, got dict"),
    ("history empty", _set("history", []), "history", "at least one step"),
    ("step not an object", _set("history.1", "plan"), "history[1]", "expected an object, got str"),
    ("step without content", _delete("history.1.content"), "history[1].content", "missing"),
    ("content not a string", _set("history.1.content", 42), "history[1].content", "got int"),
    ("step without role", _delete("history.2.role"), "history[2].role", "missing"),
    ("name not a string", _set("history.1.name", ["Planner"]), "history[1].name", "got list"),
    (
        "empty name and bare suffix role",
        _all(_set("history.1.name", ""), _set("history.1.role", "(thought)")),
        "history[1].name",
        "no agent",
    ),
    ("empty role and no name", _set("history.0.role", " "), "history[0].role", "no agent"),
    ("step id out of place", _set("history.2.step", 5), "history[2].step", "0-based position 2"),
    ("question not a string", _set("question", 7), "question", "got int"),
    ("question_ID not a string", _set("question_ID", 7), "question_ID", "got int"),
    ("mistake_step not an integer", _set("mistake_step", "two"), "mistake_step", "'two'"),
    (
        "mistake_step in non-ASCII digits",
        _set("mistake_step", "\u0663"),
        "mistake_step",
        "expected a 0-based integer",
    ),
    ("mistake_step a decimal string", _set("mistake_step", "1.5"), "mistake_step", "'1.5'"),
    ("mistake_step a float", _set("mistake_step", 1.0), "mistake_step", "1.0"),
    ("mistake_step a bool", _set("mistake_step", True), "mistake_step", "True"),
    ("mistake_step negative", _set("mistake_step", "-1"), "mistake_step", "-1 is out of range"),
    (
        "mistake_step too large",
        _set("mistake_step", 3),
        "mistake_step",
        "3 is out of range: the history has 3",
    ),
    ("mistake_step missing", _delete("mistake_step"), "mistake_step", "missing"),
    ("mistake_agent empty", _set("mistake_agent", " "), "mistake_agent", "non-empty"),
    ("mistake_agent unknown", _set("mistake_agent", "Ghost"), "mistake_agent", "unknown agent 'Ghost'"),
    ("mistake_reason not a string", _set("mistake_reason", 3), "mistake_reason", "got int"),
    # An identifier with an unpaired UTF-16 surrogate (json writes it as the escape text "\\ud800").
    (
        "qid with a lone surrogate",
        _set("qid", "x\ud800"),
        "qid",
        "contains an unpaired UTF-16 surrogate (\\ud800 at character 1); identifiers must be valid Unicode",
    ),
    (
        "question_ID with a lone surrogate",
        _set("question_ID", "task-\udc01"),
        "question_ID",
        "(\\udc01 at character 5)",
    ),
    (
        "role with a lone surrogate",
        _set("history.1.role", "assist\udbffant"),
        "history[1].role",
        "(\\udbff at character 6)",
    ),
    (
        "name with a lone surrogate",
        _set("history.2.name", "\ude00Coder"),
        "history[2].name",
        "(\\ude00 at character 0)",
    ),
    (
        "mistake_agent with a lone surrogate",
        _set("mistake_agent", "Planner\ud83d"),
        "mistake_agent",
        "(\\ud83d at character 7); identifiers must be valid Unicode",
    ),
]


@pytest.mark.parametrize(("case", "mutate", "field", "message"), BAD_RECORDS, ids=[c[0] for c in BAD_RECORDS])
def test_bad_record_names_file_record_and_field(
    case: str,
    mutate: Mutation,
    field: str,
    message: str,
    write_record: RecordWriter,
    good_record: dict[str, Any],
) -> None:
    mutate(good_record)
    bad = write_record(good_record, name="1")

    with pytest.raises(DataError) as raised:
        load_trajectory_file(bad, "src")
    error = raised.value
    assert (error.path, error.record, error.field) == (str(bad), "src/1", field)
    assert str(bad) in str(error) and "record src/1" in str(error) and f"field {field!r}" in str(error)
    assert message in str(error)

    # The same problem inside a dataset: reported, and the next good file still loads.
    write_record(_longrca("src__002"), name="2")
    records, problems = _collect(bad.parent.parent)
    assert [r.trajectory.qid for r in records] == ["src__002"]
    assert [(p.path, p.record, p.field) for p in problems] == [(str(bad), "src/1", field)]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b'{"history": [', "not valid JSON: Expecting value at line 1 column 14"),
        (b'{"history": "\xff"}', "not UTF-8 text: invalid start byte at byte 13"),
        (b"[1, 2]", "expected a JSON object, got list"),
    ],
)
def test_unparseable_file_names_file_and_record(
    content: bytes, message: str, write_record: RecordWriter
) -> None:
    bad = write_record(content, name="3")
    with pytest.raises(DataError, match=message) as raised:
        load_trajectory_file(bad, "src")
    assert (raised.value.path, raised.value.record) == (str(bad), "src/3")
    assert str(raised.value).startswith(f"{bad}, record src/3: ")


def test_unreadable_file(tmp_path: Path) -> None:
    missing = tmp_path / "src" / "9.json"
    with pytest.raises(DataError, match="cannot read file") as raised:
        load_trajectory_file(missing, "src")
    assert (raised.value.path, raised.value.record) == (str(missing), "src/9")


@pytest.mark.parametrize("padding", [0, 65_536 - 400, 65_536, 65_536 * 3 + 7])
def test_files_of_any_size_are_read_whole(
    padding: int, write_record: RecordWriter, good_record: dict[str, Any]
) -> None:
    # Around the loader's first read (64 KiB), where a larger file is sized and read in one more call.
    good_record["history"][2]["content"] = "x" * padding
    file = write_record(good_record)
    raw = file.read_bytes()
    record = load_trajectory_file(file, "src")
    assert record.trajectory.steps[2].content == "x" * padding
    assert record.trajectory.sha256 == hashlib.sha256(raw).hexdigest()


def test_a_directory_named_like_a_record_is_not_readable(tmp_path: Path) -> None:
    directory = tmp_path / "src" / "4.json"
    directory.mkdir(parents=True)
    with pytest.raises(DataError, match="cannot read file: Is a directory") as raised:
        load_trajectory_file(directory, "src")
    assert (raised.value.path, raised.value.record) == (str(directory), "src/4")


def test_duplicate_qids_within_a_dataset(write_record: RecordWriter) -> None:
    first = write_record(_longrca("dup__001"), source="a", name="dup__001")
    second = write_record(_longrca("dup__001"), source="b", name="dup__001")
    write_record(_longrca("ok__002"), source="b", name="ok__002")

    records, problems = _collect(first.parent.parent)
    assert [r.trajectory.qid for r in records] == ["dup__001", "ok__002"]
    assert len(problems) == 1
    assert (problems[0].path, problems[0].record, problems[0].field) == (
        str(second),
        "dup__001",
        "question_ID",
    )
    assert f"first seen in {first}" in str(problems[0])

    with pytest.raises(DataError, match="duplicate qid 'dup__001'"):
        list(iter_dataset(first.parent.parent))


def test_bad_jsonl_lines_name_file_line_and_field(tmp_path: Path, good_record: dict[str, Any]) -> None:
    path = tmp_path / "mixed.jsonl"
    no_source = dict(good_record)
    no_id = {**good_record, "source": "s"}
    del no_id["question_ID"]
    bad_step = {**good_record, "source": "s", "mistake_step": "9"}
    path.write_text(
        "\n".join(
            [
                json.dumps({**good_record, "source": "s"}),
                "{oops",
                json.dumps(no_source),
                json.dumps(no_id),
                json.dumps(bad_step),
                json.dumps({**good_record, "source": "s"}),
            ]
        )
    )
    problems: list[DataError] = []
    records = list(load_jsonl(path, strict=False, on_problem=problems.append))

    assert [r.trajectory.qid for r in records] == ["s/task-1"]
    assert [(p.path, p.record, p.field) for p in problems] == [
        (str(path), "line 2", ""),
        (str(path), "line 3", "source"),
        (str(path), "line 4", "question_ID"),
        (str(path), "s/task-1 (line 5)", "mistake_step"),
        (str(path), "s/task-1 (line 6)", "question_ID"),  # duplicate of line 1
    ]
    with pytest.raises(DataError, match="line 2"):
        list(load_jsonl(path))


@pytest.mark.parametrize("layout", ["empty directory", "json files at the top", "a .json file", "missing"])
def test_paths_that_are_not_datasets(layout: str, tmp_path: Path, good_record: dict[str, Any]) -> None:
    target = tmp_path / "ds"
    if layout == "empty directory":
        target.mkdir()
    elif layout == "json files at the top":
        target.mkdir()
        (target / "1.json").write_text(json.dumps(good_record))
    elif layout == "a .json file":
        target = tmp_path / "1.json"
        target.write_text(json.dumps(good_record))
    with pytest.raises(DataError) as raised:
        list(iter_dataset(target))
    assert raised.value.path == str(target)
    if layout == "json files at the top":
        assert f"trajectories, pass {tmp_path} instead" in str(raised.value)
    assert str(raised.value).split(":")[0] == str(target)


def test_count_entries_counts_files_and_jsonl_lines_without_parsing(tmp_path: Path) -> None:
    source = tmp_path / "src_a"
    source.mkdir()
    (source / "1.json").write_text("{not even json")
    (source / "2.json").write_text("{}")
    (source / "README.md").write_text("ignored")
    (tmp_path / "extra.jsonl").write_text('{"a": 1}\n\n{"b": 2}\n')
    assert count_entries(tmp_path) == 4
    assert count_entries(tmp_path / "extra.jsonl") == 2
    assert count_entries(tmp_path / "missing") == 0


def test_ground_truth_is_kept_apart_from_the_task(
    write_record: RecordWriter, good_record: dict[str, Any]
) -> None:
    record = load_trajectory_file(write_record({**good_record, "ground_truth": "42"}), "src")
    assert (record.trajectory.task, record.trajectory.ground_truth) == ("How many?", "42")
    assert load_trajectory_file(write_record(good_record, name="2"), "src").trajectory.ground_truth == ""
    with pytest.raises(DataError, match="field 'ground_truth': expected a string, got int"):
        load_trajectory_file(write_record({**good_record, "ground_truth": 42}, name="3"), "src")


# --- unpaired UTF-16 surrogates: identifiers rejected above, free text repaired ----------------------------


def test_lone_surrogates_in_free_text_become_u_fffd_and_are_listed(
    write_record: RecordWriter, good_record: dict[str, Any]
) -> None:
    good_record["history"][1]["content"] = "plan \ud800"
    good_record["history"][2]["content"] = "\udfff\ud800 code"  # low then high: two lone halves, not a pair
    good_record.update(question="How many\udc00?", ground_truth="4\ud8002", mistake_reason="bad \ud800 plan")
    file = write_record(good_record)
    assert b"\\ud800" in file.read_bytes()  # the escape, as text: the file itself is valid UTF-8

    record = load_trajectory_file(file, "src")

    trajectory = record.trajectory
    assert [step.content for step in trajectory.steps] == ["How many?", "plan \ufffd", "\ufffd\ufffd code"]
    assert (trajectory.task, trajectory.ground_truth) == ("How many\ufffd?", "4\ufffd2")
    assert record.reference is not None and record.reference.rationale == "bad \ufffd plan"
    assert record.repaired_fields == (
        "history[1].content",
        "history[2].content",
        "question",
        "ground_truth",
        "mistake_reason",
    )
    assert trajectory.sha256 == hashlib.sha256(file.read_bytes()).hexdigest()  # the original bytes
    prompt = "\n".join([trajectory.task, *(step.content for step in trajectory.steps)])
    assert prompt.encode("utf-8").count("\ufffd".encode()) == 4

    # JSON's hex digits may be upper case; json.dumps writes lower case, so this file is written by hand.
    upper = write_record(
        b'{"history": [{"role": "a", "content": "x\\uDBFF"}], "question": "\\uD83D\\uDE00"}', name="2"
    )
    record = load_trajectory_file(upper, "src")
    assert (record.trajectory.steps[0].content, record.trajectory.task) == ("x\ufffd", "\U0001f600")
    assert record.repaired_fields == ("history[0].content",)


def test_valid_pairs_and_odd_encodable_text_load_as_recorded(
    write_record: RecordWriter, good_record: dict[str, Any]
) -> None:
    odd = "nul \x00 rtl \u202e bom \ufeff zwj \u200d emoji \ud83d\ude00"
    good_record["history"][1].update(content=odd, name="Planner \ud83d\ude00", role="assistant \u202e")
    good_record.update(question=odd, mistake_agent="Planner \ud83d\ude00")
    file = write_record(good_record)
    assert b"\\ud83d\\ude00" in file.read_bytes()

    record = load_trajectory_file(file, "src")

    step = record.trajectory.steps[1]
    assert step.content == record.trajectory.task == odd.replace("\ud83d\ude00", "\U0001f600")
    assert (step.agent, step.role) == ("Planner \U0001f600", "assistant \u202e")
    assert record.reference is not None and record.reference.role == "Planner \U0001f600"
    assert record.repaired_fields == ()


def test_jsonl_source_qid_and_question_id_must_be_valid_unicode_and_content_is_repaired(
    tmp_path: Path, good_record: dict[str, Any]
) -> None:
    repaired = {**good_record, "source": "s", "question": "\ud800"}
    repaired["history"] = [{**step} for step in good_record["history"]]
    repaired["history"][0]["content"] = "x\ud800"
    lines = [
        json.dumps({**good_record, "source": "s\ud800"}),
        json.dumps({**good_record, "source": "s", "qid": "s/\udc00"}),
        json.dumps({**good_record, "source": "s", "question_ID": "t\ud800"}),
        json.dumps({**good_record, "source": "s", "mistake_agent": "Coder\ud800"}),
        json.dumps(repaired),
    ]
    path = tmp_path / "data.jsonl"
    path.write_text("\n".join(lines) + "\n")
    problems: list[DataError] = []

    records = list(load_jsonl(path, strict=False, on_problem=problems.append))

    assert [(p.path, p.record, p.field, p.message.split(";")[0]) for p in problems] == [
        (str(path), "line 1", "source", "contains an unpaired UTF-16 surrogate (\\ud800 at character 1)"),
        (str(path), "line 2", "qid", "contains an unpaired UTF-16 surrogate (\\udc00 at character 2)"),
        (
            str(path),
            "line 3",
            "question_ID",
            "contains an unpaired UTF-16 surrogate (\\ud800 at character 1)",
        ),
        (
            str(path),
            "s/task-1 (line 4)",
            "mistake_agent",
            "contains an unpaired UTF-16 surrogate (\\ud800 at character 5)",
        ),
    ]
    (record,) = records
    assert (record.trajectory.qid, record.origin) == ("s/task-1", f"{path}:5")
    assert (record.trajectory.task, record.trajectory.steps[0].content) == ("\ufffd", "x\ufffd")
    assert record.repaired_fields == ("history[0].content", "question")
    assert record.trajectory.sha256 == hashlib.sha256(lines[4].encode()).hexdigest()


def test_file_and_directory_names_that_are_not_utf8_cannot_make_a_qid(
    tmp_path: Path, good_record: dict[str, Any]
) -> None:
    # On POSIX a name that is not valid UTF-8 reads as lone surrogates (surrogateescape): b"\xff" -> "\udcff".
    root = tmp_path / "ds"
    bad_file = root / "src" / os.fsdecode(b"\xff.json")
    bad_source = root / os.fsdecode(b"s\xfe") / "1.json"
    try:
        for file in (bad_file, bad_source):
            file.parent.mkdir(parents=True, exist_ok=True)
            file.write_text(json.dumps(good_record))
    except (OSError, UnicodeError):
        pytest.skip("this file system only takes UTF-8 names")
    named = (
        root / "src" / os.fsdecode(b"n\xff.json")
    )  # an explicit LongRCA question_ID: the name is not needed
    named.write_text(json.dumps(_longrca("src__001")))

    records, problems = _collect(root)

    shown_file = f"{root}/src/\\udcff.json"
    assert [(p.path, p.record, p.field, str(p)) for p in problems] == [
        (
            shown_file,
            "src/\\udcff",
            "",
            f"{shown_file}, record src/\\udcff: qid 'src/\\udcff' (from the file and directory names) contains an "
            "unpaired UTF-16 surrogate (\\udcff at character 4); identifiers must be valid Unicode",
        ),
        (
            f"{root}/s\\udcfe/1.json",
            "s\\udcfe/1",
            "",
            f"{root}/s\\udcfe/1.json, record s\\udcfe/1: source 's\\udcfe' (the directory's name) contains an "
            "unpaired UTF-16 surrogate (\\udcfe at character 1); identifiers must be valid Unicode",
        ),
    ]
    assert [(r.trajectory.qid, r.origin) for r in records] == [("src__001", f"{root}/src/n\\udcff.json")]
    for problem in problems:
        str(problem).encode("utf-8")  # printable and storable
