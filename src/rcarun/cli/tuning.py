"""`rcarun sweep --tune-interpreter`: process-wide interpreter settings for one sweep, asked for on the command line.

The switch interval and the garbage collector belong to the whole process, so `rcarun.runner.run_sweep` never
touches them; the command may, since the process is its own. On the bench's latency-bound scenario it saves a
median 5 % CPU a call (docs/performance.md, "CPU per call"); against a provider answering in seconds CPU is not
what bounds a sweep, hence off by default.
"""

from __future__ import annotations

import contextlib
import gc
import sys
from collections.abc import Iterator

__all__ = ["tuned_interpreter"]

# Seconds a thread may hold the GIL before the interpreter asks it to hand over; Python's is 0.005.
_SWITCH_INTERVAL_S = 0.0005
# The collector's first-generation threshold; Python's is 700.
_YOUNG_GC_THRESHOLD = 10_000


@contextlib.contextmanager
def tuned_interpreter() -> Iterator[None]:
    """Hand the GIL over sooner and make the collector's passes rare while the block runs; put both back after."""
    with _responsive_loop(), _collector_tuned_for_sweeps():
        yield


@contextlib.contextmanager
def _responsive_loop(switch_interval_s: float = _SWITCH_INTERVAL_S) -> Iterator[None]:
    """Hand the GIL over more often, so the event loop sends a freed slot's next call sooner.

    The store writer's thread (and aiohttp's resolver, zlib) run Python code that holds the GIL for up to the
    switch interval, 5 ms by default, while the loop waits with an answer to read or a call to send; at 0.5 ms
    the loop gets it back within a tenth of that. A shorter interval already set is kept, and the previous one is
    restored afterwards unless someone changed it meanwhile.
    """
    previous = sys.getswitchinterval()
    sys.setswitchinterval(min(previous, switch_interval_s))
    chosen = sys.getswitchinterval()  # as the interpreter keeps it (whole microseconds), to compare exactly
    try:
        yield
    finally:
        if sys.getswitchinterval() == chosen:
            sys.setswitchinterval(previous)


@contextlib.contextmanager
def _collector_tuned_for_sweeps(young_threshold: int = _YOUNG_GC_THRESHOLD) -> Iterator[None]:
    """Make the cyclic garbage collector cheap, and put it back as it was after.

    A sweep holds tens of thousands of young objects in flight (every call's coroutines, frames and rows), and a
    young collection, due every 700 net allocations, walks them all, 1.5-5 ms each: 40-50 us of CPU a call on the
    latency-bound bench (`gc.callbacks` timing). Two changes, each undone at the end:

    - the first generation's threshold goes up to ``young_threshold``: 72 collections in a 6,400-call run instead
      of about 190, 3-4 us a call. A sweep makes little cyclic garbage (its memory is flat), and what it makes
      waits at most that many allocations to be collected;
    - the objects alive at the start (modules, the config, the libraries' own) are frozen out of every pass
      (`gc.freeze`), so an old-generation pass does not walk what the imports left behind.

    What was chosen before is kept: a higher threshold (or a disabled collector), objects already frozen; and a
    threshold someone changed meanwhile is not undone.
    """
    previous = gc.get_threshold()
    raised = previous[0] != 0 and previous[0] < young_threshold
    if raised:
        gc.set_threshold(young_threshold, *previous[1:])
    ours = gc.get_threshold()
    freezing = gc.get_freeze_count() == 0
    if freezing:
        gc.freeze()
    try:
        yield
    finally:
        if freezing:
            gc.unfreeze()
        if raised and gc.get_threshold() == ours:
            gc.set_threshold(*previous)
