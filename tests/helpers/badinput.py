"""The bad-input corpus, generated into a test's ``tmp_path`` so that the repository holds no large or broken files.

Each case is a small function of a good trajectory (``good_trajectory``) and the exact one-line error rcarun must
print for it, so a test can assert every message without reading files back. The big valid inputs (a 5,000-step
history, a 2 MB single step) are built only by the fixtures that need them. Lone UTF-16 surrogates
(``write_surrogate_dataset``) have a corpus of their own: they make errors in identifiers, warnings in free text.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LONG_HISTORY_STEPS = 5_000
HUGE_STEP_CHARS = 2_000_000


def good_trajectory(n_steps: int = 3, *, content: str = "step", **fields: Any) -> dict[str, Any]:
    """A valid Who&When-shaped record whose agents alternate A0, A1 and whose label is step 1 by A1."""
    history = [
        {"role": "assistant", "name": f"A{index % 2}", "content": f"{content} {index}"}
        for index in range(n_steps)
    ]
    return {"question": "q", "history": history, "mistake_agent": "A1", "mistake_step": 1, **fields}


def _with_step(field: str, value: object) -> dict[str, Any]:
    record = good_trajectory()
    record["history"][0][field] = value
    return record


def _without(field: str) -> dict[str, Any]:
    record = good_trajectory()
    del record[field]
    return record


@dataclass(frozen=True)
class BadFile:
    """One malformed trajectory file of source ``src`` and the problem `rcarun data check` reports for it."""

    name: str
    body: bytes
    record: str
    problem: str  # what follows "<path>, record <record>" in the message

    def message(self, root: Path) -> str:
        return f"error: {root / 'src' / self.name}, record {self.record}{self.problem}"


def _json(record: object) -> bytes:
    return json.dumps(record).encode()


BAD_FILES = (
    BadFile(
        "2.json",
        _json(good_trajectory())[:40],
        "src/2",
        ": not valid JSON: Unterminated string starting at at line 1 column 40",
    ),
    BadFile(
        "3.json",
        _json(good_trajectory(history={"0": "not a list"})),
        "src/3",
        ", field 'history': expected a list of steps, got dict",
    ),
    BadFile(
        "4.json",
        _json(_with_step("content", 5)),
        "src/4",
        ", field 'history[0].content': expected a string, got int",
    ),
    BadFile(
        "5.json",
        _json(good_trajectory(mistake_step=1.5)),
        "src/5",
        ", field 'mistake_step': expected a 0-based integer step (or a string holding one), got 1.5",
    ),
    BadFile(
        "6.json",
        _json(good_trajectory(mistake_step=True)),
        "src/6",
        ", field 'mistake_step': expected a 0-based integer step (or a string holding one), got True",
    ),
    BadFile("7.json", _json(_without("history")), "src/7", ", field 'history': missing"),
    BadFile(
        "8.json",
        _json(good_trajectory(history=[])),
        "src/8",
        ", field 'history': empty: a trajectory needs at least one step",
    ),
    BadFile(
        "9.json",
        _json(good_trajectory(mistake_step=7)),
        "src/9",
        ", field 'mistake_step': 7 is out of range: the history has 3 steps (0-based)",
    ),
    BadFile(
        "10.json",
        _json(good_trajectory(mistake_agent="Nobody")),
        "src/10",
        ", field 'mistake_agent': unknown agent 'Nobody': not among the recorded agents ['A0', 'A1']",
    ),
    BadFile(
        "11.json",
        b'{"history": [{"role": "a", "content": "caf\xe9"}]}',
        "src/11",
        ": not UTF-8 text: invalid continuation byte at byte 42",
    ),
)


@dataclass(frozen=True)
class BadDataset:
    """A dataset directory with good and bad records, and every error line `rcarun data check` must print."""

    root: Path
    good: int
    messages: tuple[str, ...]


def write_bad_dataset(root: Path) -> BadDataset:
    (root / "src").mkdir(parents=True)
    (root / "other").mkdir()
    (root / "src" / "1.json").write_bytes(_json(good_trajectory()))
    for bad in BAD_FILES:
        (root / "src" / bad.name).write_bytes(bad.body)
    # Duplicate qid across sources: "other" is read before "src", so the copy in src is the problem.
    (root / "other" / "1.json").write_bytes(_json(good_trajectory(qid="dup")))
    (root / "src" / "12.json").write_bytes(_json(good_trajectory(qid="dup")))
    # A JSONL file (read before the source directories) with one bad line between good ones.
    lines = [
        json.dumps(good_trajectory(source="lines", question_ID="a")),
        json.dumps(good_trajectory(source="lines", question_ID="b", mistake_step="one")),
        "",
        json.dumps(good_trajectory(source="lines", question_ID="c"))[:-1],
        json.dumps(good_trajectory(source="lines", question_ID="d")),
    ]
    (root / "lines.jsonl").write_text("\n".join(lines) + "\n")
    jsonl = root / "lines.jsonl"
    messages = (
        f"error: {jsonl}, record lines/b (line 2), field 'mistake_step': "
        "expected a 0-based integer step (or a string holding one), got 'one'",
        f"error: {jsonl}, record line 4: not valid JSON: Expecting ',' delimiter at line 1 column "
        f"{len(lines[3]) + 1}",
        *(bad.message(root) for bad in BAD_FILES),
        f"error: {root / 'src' / '12.json'}, record dup, field 'qid': "
        f"duplicate qid 'dup' (first seen in {root / 'other' / '1.json'})",
    )
    return BadDataset(root=root, good=4, messages=messages)


# Unpaired UTF-16 surrogates: json.dumps (ensure_ascii) writes each as the literal escape text "\\ud800", which
# Python's json decodes into a str that cannot be encoded to UTF-8. Identifiers holding one are unusable;
# free text is repaired (U+FFFD) and reported as a warning. Valid pairs and odd but encodable text stay accepted.
LONE = "\ud800"
EMOJI = "\ud83d\ude00"  # a valid pair: json.loads joins it into U+1F600
ODD_TEXT = "nul \x00 rtl \u202e bom \ufeff zwj \u200d " + EMOJI


def _surrogate_error(where: str, record: str, field: str, escape: str, position: int) -> str:
    return (
        f"error: {where}, record {record}, field {field!r}: contains an unpaired UTF-16 surrogate "
        f"({escape} at character {position}); identifiers must be valid Unicode"
    )


def _repaired_warning(where: str, record: str, fields: str) -> str:
    return f"warning: {where}, record {record}: unpaired UTF-16 surrogates replaced by U+FFFD in {fields}"


@dataclass(frozen=True)
class SurrogateDataset:
    """Lone surrogates in a JSONL file and a source directory, with every line `rcarun data check` must print.

    Attributes:
        root: the dataset directory.
        lines: the error and warning lines, in the order the check prints them.
        loaded: qids of the records that load (repaired or clean).
        repaired: qids of the records whose text was repaired.
    """

    root: Path
    lines: tuple[str, ...]
    loaded: tuple[str, ...]
    repaired: tuple[str, ...]

    @property
    def errors(self) -> tuple[str, ...]:
        return tuple(line for line in self.lines if line.startswith("error: "))


def write_surrogate_dataset(root: Path) -> SurrogateDataset:
    root.mkdir(parents=True)
    jsonl = root / "lines.jsonl"
    repaired_line = good_trajectory(
        source="lines", question_ID="a", ground_truth=f"4{LONE}2", mistake_reason=f"cut {LONE}"
    )
    repaired_line["history"][2]["content"] = f"half an emoji: {LONE}"
    bad_role = good_trajectory(source="lines", question_ID="e")
    bad_role["history"][1]["role"] = f"assist{LONE}ant"
    odd_line = good_trajectory(source="lines", question_ID="f", question=ODD_TEXT, mistake_agent=f"A1{EMOJI}")
    odd_line["history"][1]["name"] = f"A1{EMOJI}"
    odd_line["history"][0]["content"] = ODD_TEXT
    odd_line["history"][0]["role"] = "assistant \u202e"
    records = [
        repaired_line,
        good_trajectory(source=f"li{LONE}nes", question_ID="b"),
        good_trajectory(source="lines", question_ID="b\udc00"),
        good_trajectory(source="lines", question_ID="c", qid=f"lines/c{LONE}"),
        bad_role,
        odd_line,
    ]
    jsonl.write_text("".join(json.dumps(record) + "\n" for record in records))

    source = root / "u"
    source.mkdir()
    repaired_file = good_trajectory(question=f"{LONE}q")
    repaired_file["history"][2]["content"] = f"step {LONE} 2"
    bad_name = good_trajectory()
    bad_name["history"][0]["name"] = f"A{LONE}"
    bad_role_file = good_trajectory()
    bad_role_file["history"][1]["role"] = f"\udfff{LONE}"
    odd_file = good_trajectory(question=ODD_TEXT)
    odd_file["history"][1]["content"] = ODD_TEXT
    files = [
        repaired_file,
        good_trajectory(qid=f"x{LONE}"),
        bad_role_file,
        bad_name,
        good_trajectory(mistake_agent="A1\udc00"),
        odd_file,
    ]
    for number, record in enumerate(files, start=1):
        (source / f"{number}.json").write_bytes(_json(record))

    def file(number: int) -> Path:
        return source / f"{number}.json"

    lines = (
        _repaired_warning(f"{jsonl}:1", "lines/a", "history[2].content, ground_truth, mistake_reason"),
        _surrogate_error(str(jsonl), "line 2", "source", "\\ud800", 2),
        _surrogate_error(str(jsonl), "line 3", "question_ID", "\\udc00", 1),
        _surrogate_error(str(jsonl), "line 4", "qid", "\\ud800", 7),
        _surrogate_error(str(jsonl), "lines/e (line 5)", "history[1].role", "\\ud800", 6),
        _repaired_warning(str(file(1)), "u/1", "history[2].content, question"),
        _surrogate_error(str(file(2)), "u/2", "qid", "\\ud800", 1),
        _surrogate_error(str(file(3)), "u/3", "history[1].role", "\\udfff", 0),
        _surrogate_error(str(file(4)), "u/4", "history[0].name", "\\ud800", 1),
        _surrogate_error(str(file(5)), "u/5", "mistake_agent", "\\udc00", 2),
    )
    return SurrogateDataset(
        root=root, lines=lines, loaded=("lines/a", "lines/f", "u/1", "u/6"), repaired=("lines/a", "u/1")
    )


def write_big_dataset(root: Path) -> Path:
    """Valid but extreme: a 5,000-step history and a 2 MB single step, beside one ordinary trajectory."""
    (root / "src").mkdir(parents=True)
    (root / "src" / "1.json").write_bytes(_json(good_trajectory()))
    (root / "src" / "2.json").write_bytes(_json(good_trajectory(LONG_HISTORY_STEPS, content="ok")))
    huge = good_trajectory()
    huge["history"][1]["content"] = "x" * HUGE_STEP_CHARS
    (root / "src" / "3.json").write_bytes(_json(huge))
    return root


def write_small_dataset(root: Path) -> Path:
    (root / "src").mkdir(parents=True)
    for name in ("1.json", "2.json"):
        (root / "src" / name).write_bytes(_json(good_trajectory()))
    return root
