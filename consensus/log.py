"""One replica's Raft log in memory, and the cursors that walk along it.

Entry `i` (offset < i <= last) is `terms[i - offset - 1]`, `data[i - offset - 1]`;
everything up to `offset` is compacted into a snapshot and only the term of entry
`offset` is kept. Two flat lists instead of entry objects keep the hot path free of
per-entry Python objects (docs/raft-engine.md, "Throughput").

The cursors, in the order an entry passes them (as etcd's raftLog and unstable):
`handed` (given to the driver to persist), `stable` (reported durable), `commit`
(durable on a quorum), `applied_handed` (given to the driver to apply). `commit` may
pass `stable`: committed entries are durable elsewhere and may be applied first.
"""

from __future__ import annotations

import bisect
from itertools import accumulate


class RaftLog:
    __slots__ = ("offset", "offset_term", "terms", "data", "stable", "handed", "commit", "applied_handed",
                 "snap_index", "snap_term", "pending_reset")

    def __init__(self, offset: int, offset_term: int, terms: list[int], data: list[bytes], *,
                 commit: int, applied: int, snapshot: tuple[int, int] | None) -> None:
        if len(terms) != len(data):
            raise ValueError("log terms and data differ in length")
        self.offset = offset
        self.offset_term = offset_term
        self.terms = terms
        self.data = data
        last = self.last_index()
        self.snap_index, self.snap_term = snapshot or (offset, offset_term)
        if self.snap_index < offset:
            raise ValueError(f"log compacted to {offset} but the newest snapshot is {self.snap_index}")
        self.commit = min(max(commit, self.snap_index), max(last, self.snap_index))
        self.applied_handed = max(applied, self.snap_index)
        self.stable = last  # everything given at start is durable
        self.handed = last
        # (index, term) of a snapshot installed over a log that did not contain it: the driver must
        # drop its stored log (Ready.reset_to) before persisting anything else.
        self.pending_reset: tuple[int, int] | None = None

    # ------------------------------------------------------------------ lookup
    def last_index(self) -> int:
        return self.offset + len(self.terms)

    def last_term(self) -> int:
        return self.terms[-1] if self.terms else self.offset_term

    def term_at(self, index: int) -> int | None:
        """Term of the entry at `index`, or None if it is compacted away or absent."""
        if index == self.offset:
            return self.offset_term
        if index < self.offset or index > self.offset + len(self.terms):
            return None
        return self.terms[index - self.offset - 1]

    def conflict_hint(self, prev: int) -> tuple[int, int]:
        """(hint_index, hint_term) for refusing an append after `prev` (see messages.AppendResp).

        Terms in a log never decrease, so the first entry of a term is a bisection away; the hint
        never points at or below the commit index, which cannot conflict.
        """
        last = self.last_index()
        if prev > last:
            return last + 1, 0
        hint_term = self.term_at(prev) or 0
        pos = bisect.bisect_left(self.terms, hint_term, 0, prev - self.offset)
        return max(self.offset + pos + 1, self.commit + 1), hint_term

    def after_term(self, term: int, upto: int) -> int | None:
        """The index after this log's last entry of `term` at or below `upto`, if it has any."""
        hi = max(0, min(upto, self.last_index()) - self.offset)
        pos = bisect.bisect_right(self.terms, term, 0, hi)
        if pos > 0 and self.terms[pos - 1] == term:
            return self.offset + pos + 1
        return None

    def entries_after(self, prev: int, max_entries: int, max_bytes: int) -> tuple[list[int], list[bytes]]:
        """Entries from `prev + 1` on for one AppendEntries: at most `max_entries`, cut at
        `max_bytes` of data (but at least one entry) so every message fits a frame."""
        lo = prev - self.offset
        hi = min(len(self.terms), lo + max_entries)
        terms = self.terms[lo:hi]
        data = self.data[lo:hi]
        if len(data) > 1 and sum(map(len, data)) > max_bytes:
            n = max(1, bisect.bisect_right(list(accumulate(map(len, data))), max_bytes))
            terms, data = terms[:n], data[:n]
        return terms, data

    # ------------------------------------------------------------------ changes
    def append(self, terms: list[int], data: list[bytes]) -> None:
        """Add entries after the last one (the leader's own proposals)."""
        self.terms.extend(terms)
        self.data.extend(data)

    def merge(self, prev: int, terms: list[int], data: list[bytes]) -> int:
        """A follower's append of a leader's entries that follow `prev` (whose term matched):
        skip those it already holds, replace its log from the first conflict on. Returns the
        index of the last entry given."""
        n = len(terms)
        if n:
            if prev == self.last_index():
                self.append(terms, data)
            else:
                k = 0
                last = self.last_index()
                while k < n and prev + 1 + k <= last and self.term_at(prev + 1 + k) == terms[k]:
                    k += 1
                if k < n:
                    self._truncate_and_append(prev + 1 + k, terms[k:], data[k:])
        return prev + n

    def _truncate_and_append(self, first: int, terms: list[int], data: list[bytes]) -> None:
        """Replace everything from `first` on with the given entries."""
        cut = first - self.offset - 1
        if cut < len(self.terms):
            if first <= self.commit:  # would violate Raft safety: committed entries never change
                raise AssertionError(f"truncating committed entry {first} <= {self.commit}")
            del self.terms[cut:]
            del self.data[cut:]
            self.stable = min(self.stable, first - 1)
            self.handed = min(self.handed, first - 1)
        self.terms.extend(terms)
        self.data.extend(data)

    def persisted(self, index: int, term: int) -> bool:
        """The driver made entries up to (index, term) durable; False if that is no news (or
        about entries since replaced)."""
        if index > self.stable and self.term_at(index) == term:
            self.stable = index
            return True
        return False

    def snapshot_taken(self, index: int, term: int) -> None:
        if index > self.snap_index:
            self.snap_index, self.snap_term = index, term

    def compact(self, upto: int) -> None:
        """Forget entries up to `upto`, never past the newest snapshot or what is durable and applied."""
        upto = min(upto, self.snap_index, self.applied_handed, self.stable)
        if upto <= self.offset:
            return
        term = self.term_at(upto)
        if term is None:
            raise AssertionError(f"compacting to {upto}, which this log does not hold")
        cut = upto - self.offset
        del self.terms[:cut]
        del self.data[:cut]
        self.offset, self.offset_term = upto, term

    def restore(self, index: int, term: int) -> None:
        """A snapshot at (index, term) was installed: it is committed and applied. If this log
        does not hold its last entry nothing in it can be kept, and the stored log is reset."""
        if self.term_at(index) != term:
            self.terms.clear()
            self.data.clear()
            self.offset, self.offset_term = index, term
            self.stable = self.handed = index
            self.pending_reset = (index, term)
        self.commit = index
        self.applied_handed = max(self.applied_handed, index)
        self.snapshot_taken(index, term)

    # ------------------------------------------------------------------ hand-outs for the Ready
    def has_unhanded(self) -> bool:
        return self.handed < self.last_index()

    def take_unhanded(self) -> tuple[int, list[int], list[bytes]]:
        """(first index, terms, data) of the entries not yet given out for persisting."""
        lo = self.handed - self.offset
        first = self.handed + 1
        self.handed = self.last_index()
        return first, self.terms[lo:], self.data[lo:]

    def take_committed(self) -> tuple[int, list[int], list[bytes]]:
        """(first index, terms, data) of committed entries not yet given out for applying."""
        lo = self.applied_handed - self.offset
        hi = self.commit - self.offset
        first = self.applied_handed + 1
        self.applied_handed = self.commit
        return first, self.terms[lo:hi], self.data[lo:hi]
