"""The cyclic garbage collector paused over one batch of a Python worker's work.

The job's Python workers build many short-lived objects a batch (a dict per heartbeat read, the
bucket's state and output) beside many long-lived ones (each bucket's decoded `SetWatch`es,
kept across batches; PySpark's own). CPython's collector runs every 700 net allocations and,
every hundredth run or so, walks every tracked object of the process: measured offline (the
`gc.callbacks` hook), that was 35-44% of the operator's batch at 10,000 sets and 8-14% at 1,000,
and 40% of the reader's parse at 10,000. None of it finds anything: what a batch builds is freed
by reference counting (no cycles), and what it keeps is the state.

So the collector is paused while a batch's records are parsed or its bucket processed, and
resumed after; it then runs once on what the batch left alive instead of dozens of times over
the whole heap. A cycle made meanwhile is collected by a later run as before. Whoever had the
collector off keeps it off.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
