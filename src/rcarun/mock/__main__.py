"""``python -m rcarun.mock``: run the simulator in this process (see `rcarun.mock.cli`)."""

from __future__ import annotations

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
