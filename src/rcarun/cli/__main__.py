"""``python -m rcarun.cli``: the same as the ``rcarun`` command."""

from rcarun.cli import entry

raise SystemExit(entry())
