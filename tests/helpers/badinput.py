"""The bad-input corpus, generated into a test's ``tmp_path`` so that the repository holds no large or broken files.

Each case is a small function of a good trajectory (``good_trajectory``) and the exact one-line error rcarun must
print for it, so a test can assert every message without reading files back. The big valid inputs (a 5,000-step
history, a 2 MB single step) are built only by the fixtures that need them.
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
