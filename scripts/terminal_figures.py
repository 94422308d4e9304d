"""Count the terminal control sequences `rcarun show` sends to a real pseudo-terminal, and print them.

    PYTHONPATH=src .venv/bin/python -m pytest tests/test_cli_terminal.py --basetemp=/tmp/escapes -k json
    .venv/bin/python scripts/terminal_figures.py /tmp/escapes/escapes0/results.db [--src PATH]

The results.db is the one `tests/test_cli_terminal.py` sweeps (answers, reasoning and a trajectory full of
ESC[2J, OSC 0, OSC 52, OSC 8, C1 CSI, carriage returns and backspaces). ``--src`` picks the rcarun source tree the
child runs (another checkout's, to measure before a change). One row per command: ESC bytes, each sequence, C1
CSIs, BELs, backspaces and carriage returns not before a newline that reached the terminal.
"""

from __future__ import annotations

import argparse
import os
import re
import select
import subprocess
import sys
from pathlib import Path

_COUNTED = {
    "ESC": b"\x1b",
    "OSC 0": b"\x1b]0;",
    "OSC 52": b"\x1b]52;",
    "OSC 8": b"\x1b]8;",
    "ESC[2J": b"\x1b[2J",
    "C1 CSI": "\u009b".encode(),
    "BEL": b"\x07",
    "backspace": b"\x08",
}


def _through_a_terminal(src: Path, *args: str) -> bytes:
    master, slave = os.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "rcarun.cli", *args],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env={**os.environ, "PYTHONPATH": str(src)},
    )
    os.close(slave)
    chunks = []
    while select.select([master], [], [], 30)[0]:
        try:
            chunk = os.read(master, 1 << 16)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(master)
    process.wait(30)
    return b"".join(chunks)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("db", type=Path)
    parser.add_argument("--src", type=Path, default=Path(__file__).resolve().parents[1] / "src")
    parser.add_argument("--run", default="escapes")
    parser.add_argument("--qid", default="src/x1")
    args = parser.parse_args()
    print("| command | " + " | ".join(_COUNTED) + " | lone CR |")
    print("| --- |" + " ---: |" * (len(_COUNTED) + 1))
    for flags in ((), ("--full",), ("--json",)):
        shown = _through_a_terminal(
            args.src.resolve(), "show", "--db", str(args.db), "--run", args.run, "--qid", args.qid, *flags
        )
        counts = [shown.count(sequence) for sequence in _COUNTED.values()]
        counts.append(len(re.findall(rb"\r(?!\n)", shown)))  # the terminal itself writes CRLF for a newline
        print(f"| show {' '.join(flags)} | " + " | ".join(str(count) for count in counts) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
