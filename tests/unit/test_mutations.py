"""The deliberate-bug switch: off by default, names checked, forced() scoped to a block."""

import pytest

from electra.consensus import mutations
from electra.consensus.snapshots import BytesSink, make_blob


def test_off_by_default_and_unknown_names_are_errors():
    assert mutations.active() == frozenset()
    assert mutations.banner() is None
    with pytest.raises(ValueError, match="unknown mutation"):
        mutations.enabled("no_such_bug")
    with pytest.raises(ValueError, match="unknown mutation"), mutations.forced("no_such_bug"):
        pass


def test_forced_is_scoped_and_changes_behaviour():
    blob = bytearray(make_blob(7, 2, b"state" * 10))
    blob[-1] ^= 0xFF  # damage the data, keep the header
    sink = BytesSink()
    sink.write(0, bytes(blob))
    with pytest.raises(Exception, match="(?i)checksum|crc|corrupt"):
        sink.finish()
    with mutations.forced("snapshot_apply_unverified"):
        assert mutations.enabled("snapshot_apply_unverified")
        assert "NEVER" in (mutations.banner() or "")
        assert sink.finish().index == 7  # the bug: damaged data accepted
    assert not mutations.enabled("snapshot_apply_unverified")
