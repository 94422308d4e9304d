"""``python -m rcarun.cli``: the same as the ``rcarun`` command."""

from rcarun.cli import main

raise SystemExit(main())
