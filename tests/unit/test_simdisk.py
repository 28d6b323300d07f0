"""The simulator's disk: what a power loss keeps of unsynced writes."""

from __future__ import annotations

import random
from pathlib import Path

from electra.consensus.simdisk import DiskFaults, SimFiles

PAGE = 4096


def _crashed(seed: int, synced: bytes, unsynced: bytes) -> bytes:
    disk = SimFiles(random.Random(seed), DiskFaults(torn_write=1.0, lost_pages=0.5, page_bytes=PAGE))
    path = Path("/d/log.seg")
    f = disk.open_append(path, create=True)
    f.write(synced)
    f.sync()
    disk.sync_dir(path.parent)
    f.write(unsynced)
    disk.crash()
    return disk.read_bytes(path)


def test_a_crash_can_lose_middle_pages_of_an_unsynced_write_while_later_ones_survive():
    """Linux writes dirty pages back in no order: a page in the middle of an unsynced write can read back as zeros
    after a power loss while a later page (and the file size) survived. The crash model must produce that, seeded,
    and never touch synced bytes."""
    synced = bytes(range(1, 101)) * 10  # 1,000 bytes, no zeros
    unsynced = bytes(range(1, 251)) * 64  # 16,000 bytes, no zeros: pages 0 (from 1,000) to 4
    middle_losses = 0
    for seed in range(40):
        got = _crashed(seed, synced, unsynced)
        assert got == _crashed(seed, synced, unsynced)  # deterministic per seed
        assert got[:len(synced)] == synced and len(synced) < len(got) <= len(synced) + len(unsynced)
        want = synced + unsynced
        lost = [p for p in range(len(got) // PAGE + 1) if got[p * PAGE:(p + 1) * PAGE] != want[p * PAGE:(p + 1) * PAGE]]
        last = (len(got) - 1) // PAGE
        zeroed = [p for p in lost if p < last]
        for p in zeroed:  # whole pages (past the synced bytes) read back as zeros
            lo = max(p * PAGE, len(synced))
            assert got[lo:(p + 1) * PAGE] == bytes((p + 1) * PAGE - lo), (seed, p)
        if zeroed:
            assert got[last * PAGE:len(got)] == want[last * PAGE:len(got)]  # a later page survived whole
            middle_losses += 1
    assert 5 <= middle_losses <= 35


def test_the_log_recovers_from_every_crash_that_lost_only_unsynced_writes():
    """LogStorage on the simulator's disk: power lost during a sync's fsync (the write in the page cache, the
    fsync not returned), whatever the crash kept of it, the log recovers to at least what was synced and never
    refuses (the simulator counts a refusal without bit rot as a violation)."""
    from electra.consensus.storage import LogStorage

    middle_losses = 0
    for seed in range(60):
        disk = SimFiles(random.Random(seed), DiskFaults(torn_write=1.0, page_bytes=PAGE))
        s = LogStorage(Path("/d/raft-log"), files=disk)
        s.open()
        s.save_hard_state(1, 1)
        s.append(1, [1], [b"synced"])
        s.sync()
        s.append(2, [1] * 40, [b"x" * 300] * 40)  # one group commit of two Readies: ~12 KB, then a small record
        s.save_hard_state(2, 0)
        s.append(42, [2], [b"y"])
        disk.in_flight = []  # the sync's fsync is under way when the power fails
        s.sync()
        disk.in_flight = None
        lost_before = disk.counts["lost_pages"]
        disk.crash()
        middle_losses += disk.counts["lost_pages"] - lost_before
        rec = LogStorage(Path("/d/raft-log"), files=disk).open()
        assert rec.datas[0] == b"synced" and rec.term >= 1, seed
        assert rec.last_index in (1, 41, 42), seed  # whole records only: the first, maybe the batch's
    assert middle_losses >= 5
