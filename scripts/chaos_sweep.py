"""Run the chaos sweep once and print its reconciliation table (see tests/chaos/harness.py for what it proves).

    .venv/bin/python scripts/chaos_sweep.py --seed 7 [--kills 5] [--timeout-s 300] [--json] [--keep DIR]

Exit status 0 when every check holds, 1 otherwise. Every sweep it starts runs under the --timeout-s wall clock
(a hung one is SIGKILLed and reported as hung), so the script itself always ends.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

# The harness lives with the tests, which import it too.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from chaos.harness import MAX_EXTRA_RESUMES, ChaosReport, render_table, run_chaos_sweep


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--seed", type=int, default=1, help="drives fault draws, kill moments and the sweep")
    parser.add_argument("--kills", type=int, default=5, help="SIGKILLs before the final resume (default 5)")
    parser.add_argument(
        "--timeout-s", type=float, default=300.0, help="wall-clock limit of the whole sweep (default 300)"
    )
    parser.add_argument(
        "--max-extra-resumes",
        type=int,
        default=MAX_EXTRA_RESUMES,
        help=f"resumes after runs that exit 3 (stopped) before giving up (default {MAX_EXTRA_RESUMES})",
    )
    parser.add_argument("--json", action="store_true", help="print the full report as JSON")
    parser.add_argument("--keep", type=Path, help="run in this directory and keep results.db there")
    args = parser.parse_args()

    def run(workdir: Path) -> ChaosReport:
        return run_chaos_sweep(
            workdir,
            args.seed,
            args.kills,
            timeout_s=args.timeout_s,
            max_extra_resumes=args.max_extra_resumes,
        )

    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=True)
        report = run(args.keep)
    else:
        with tempfile.TemporaryDirectory(prefix="rcarun-chaos-") as workdir:
            report = run(Path(workdir))
    print(json.dumps(report.to_dict(), indent=2) if args.json else render_table(report))
    return 0 if not report.problems() else 1


if __name__ == "__main__":
    sys.exit(main())
