"""Bootstrap an empty node (or a whole cluster that lost its disks) from the tier.

Before `RaftNode.start()`: fold the tables to the newest state they hold (the
newest snapshot plus the events after it, up to the events table's progress),
write it as a local Raft snapshot file at that index and the entry's term (via
`SnapshotStore`, so it is checksummed and renamed like any snapshot), reset the
empty Raft log to start after it, and record a hard-state term no lower than
any term the tables have seen (Raft terms must not go backwards, and a fresh
leader's term must exceed the last uploader's term or its claim is fenced).
The node then starts as if it had taken that snapshot itself and catches up
through Raft: log entries after the index, or InstallSnapshot when the leader
has compacted past it. A node that already has a snapshot or log is left alone.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from electra.consensus.snapshots import SnapshotStore
from electra.consensus.storage import LogStorage
from electra.state.machine import ControllerStateMachine

from .reader import TierReader

log = logging.getLogger("electra.tiering.bootstrap")


class BootstrapError(RuntimeError):
    """The tier cannot give this node a state to start from; the node does not start."""


@dataclass(frozen=True)
class Bootstrapped:
    index: int
    term: int
    hard_term: int
    sets: int
    snapshot_path: Path


def bootstrap_from_tier(data_dir: str | Path, uri: str, storage_options: dict[str, str] | None = None, *,
                        fsync: bool = True, keep: int = 3) -> Bootstrapped | None:
    """Write a local snapshot from the tier into an empty node's data dir; None if nothing was done."""
    data_dir = Path(data_dir)
    snaps = SnapshotStore(data_dir / "snapshots", keep=keep, fsync=fsync)
    if snaps.latest() is not None:
        log.info("bootstrap: %s already has a snapshot; not bootstrapping", data_dir)
        return None
    storage = LogStorage(data_dir / "raft-log", fsync=fsync)
    rec = storage.open()
    try:
        if rec.last_index > 0:
            log.info("bootstrap: %s already has a Raft log up to %d; not bootstrapping", data_dir, rec.last_index)
            return None
        reader = TierReader(uri, storage_options)
        absence = reader.store.absence()
        if absence:
            # Asked to restore, and nothing to restore from (a wrong path, an unmounted volume): starting
            # empty would create a new cluster state and, with it, fresh tables at that path.
            raise BootstrapError(f"bootstrap from the tier: {absence}; nothing to start this node from (check the "
                                 "path; to start it empty, drop --bootstrap-from-tier)")
        st = reader.state_at_index(None)
        if st.index == 0:
            return None
        if not st.complete:
            log.warning("bootstrap: the tier's state at %d crosses gaps %s", st.index, st.gaps)
        term = st.term  # from the rows, or the progress at exactly that index (`state_at_index`)
        if term == 0:
            raise BootstrapError(f"bootstrap from the tier: it does not record the term of entry {st.index}")
        ev, sp = reader.store.progress("events"), reader.store.progress("snapshots")
        hard_term = max(term, ev.term, sp.term, rec.term)  # uploaders' terms, read now: never lower
        sm = ControllerStateMachine()
        sm.sets, sm.applied = st.sets, st.index
        # The term first, durably: once the snapshot exists a restart skips bootstrap, and a node that then
        # started at term 0 under a snapshot of term 7 would hand out terms below the tier's (its uploads
        # fenced) and, with a majority so restarted, lose committed entries to the older-term comparison.
        # A vote already cast in that very term is kept (a crash between the two writes, then a rerun).
        storage.save_hard_state(hard_term, rec.vote if hard_term == rec.term else 0)
        storage.sync()
        _, finish = snaps.create(st.index, term, sm.snapshot)
        meta = finish()
        storage.reset(st.index, term)  # a crash before this is repaired at start (the snapshot is newer)
        storage.sync()
        log.info("bootstrap: %s starts from the tier's state at index %d term %d (%d broker sets)",
                 data_dir, st.index, term, len(st.sets))
        return Bootstrapped(st.index, term, hard_term, len(st.sets), meta.path)
    finally:
        storage.close()
