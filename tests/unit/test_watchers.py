"""What a resuming watcher is sent (api/watchers.py): missed changes, or a resync when they are not held."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from electra.api import watchers as W


class _View(SimpleNamespace):
    def role_fields(self) -> dict:
        return {"masterBrokerId": 1, "masterAddress": "a", "masterEpoch": self.epoch, "syncStateSet": [1],
                "syncStateSetEpoch": self.epoch}


class _Machine:
    """The state machine's side the watchers use: a set per name (its cluster and epoch), applied index."""

    def __init__(self) -> None:
        self.applied = 0
        self.apply_time_ms = 0
        self.sets: dict[str, _View] = {}
        self.listeners: list = []

    def on_event(self, fn) -> None:
        self.listeners.append(fn)

    def on_restore(self, fn) -> None:
        self.restore = fn

    def view(self, name: str):
        return self.sets.get(name)

    def change(self, name: str, cluster: str | None = "c1", kind: str = "AlterSyncStateSet") -> int:
        """Apply one change of `name` (cluster None: the set is removed); its index."""
        self.applied += 1
        if cluster is None:
            self.sets.pop(name, None)
        else:
            old = self.sets.get(name)
            self.sets[name] = _View(cluster_name=cluster, broker_name=name, epoch=(old.epoch + 1) if old else 1)
        for fn in self.listeners:
            fn(self.applied, {"type": kind, "brokerName": name})
        return self.applied


def _watchers(leader: bool = True) -> tuple[W.Watchers, _Machine]:
    sm = _Machine()
    class _Node(SimpleNamespace):
        @property
        def applied(self) -> int:  # the Raft index (no-op entries included; here every entry is a command)
            return sm.applied

    node = _Node(core=SimpleNamespace(term_at=lambda i: 1, committed_in_term=lambda: True), is_leader=leader)
    return W.Watchers(node, sm), sm  # type: ignore[arg-type]


def _resume(w: W.Watchers, name: str, after: int, cluster_ok=None) -> list[tuple[str, int]]:
    return [(kind, ev["index"]) for kind, ev in asyncio.run(w.resume(name, after, cluster_ok))]


def test_a_resume_gets_the_sets_changes_after_its_index_only():
    w, sm = _watchers()
    a1, _, a2 = sm.change("a"), sm.change("b"), sm.change("a")
    sm.change("a", kind="UpdateBrokerAddress")  # not a role change
    assert _resume(w, "a", 0) == [("role-change", a1), ("role-change", a2)]
    assert _resume(w, "a", a1) == [("role-change", a2)]
    assert _resume(w, "a", sm.applied) == []


def test_changes_no_longer_held_give_a_resync_with_the_set_now():
    w, sm = _watchers()
    first = sm.change("a")
    for _ in range(W.RECENT_PER_SET):
        sm.change("a")
    assert _resume(w, "a", first - 1) == [("resync", sm.applied)]  # `first` was dropped
    assert len(_resume(w, "a", first)) == W.RECENT_PER_SET
    # removed, then created again: what the old set had after the index is gone
    b = sm.change("b")
    sm.change("b", cluster=None, kind="CleanBrokerData")
    again = sm.change("b", cluster="c2")
    assert _resume(w, "b", b - 1) == [("resync", sm.applied)]
    assert _resume(w, "b", again - 1) == [("role-change", again)]
    # a snapshot installed: nothing before it is told
    sm.restore(sm.applied)
    assert _resume(w, "a", sm.applied - 1) == [("resync", sm.applied)]


def test_a_credential_limited_to_a_cluster_is_not_told_another_clusters_changes():
    # c2's set s, removed, then created again in c1: a c1 watcher resuming from before gets the set now
    w, sm = _watchers()
    sm.change("s", cluster="c2")
    sm.change("s", cluster=None, kind="CleanBrokerData")
    sm.change("s", cluster="c1")
    got = asyncio.run(w.resume("s", 0, "c1".__eq__))
    assert [k for k, _ in got] == ["resync"] and got[0][1]["masterEpoch"] == 1
    # and a change recorded under another cluster is never replayed to it
    w2, sm2 = _watchers()
    sm2.change("t", cluster="c2")
    mine = sm2.change("t", cluster="c1")  # (the API never moves a set; the check does not rely on it)
    assert _resume(w2, "t", 0, "c1".__eq__) == [("role-change", mine)]
    assert _resume(w2, "t", 0) == [("role-change", 1), ("role-change", mine)]


def test_an_index_not_applied_here_sends_a_follower_elsewhere_and_a_leader_resyncs(monkeypatch):
    monkeypatch.setattr(W, "CATCH_UP_S", 0.1)
    w, sm = _watchers(leader=False)
    sm.change("a")
    try:
        asyncio.run(w.resume("a", 50))
        raise AssertionError("a follower behind must not answer")
    except W.NotApplied as exc:
        assert "applied up to index 1, not 50" in str(exc)
    leader, lsm = _watchers(leader=True)
    lsm.change("a")
    assert _resume(leader, "a", 50) == [("resync", 1)]


def test_open_watchers_are_sent_a_resync_when_a_snapshot_replaces_the_state():
    w, sm = _watchers()

    async def main():
        q = w.subscribe("a")
        sm.change("a")
        sm.restore(sm.applied)
        assert q.get_nowait() == W.RESYNC and q.empty()  # the change before the snapshot is replaced by it
        sm.change("a")
        assert q.get_nowait()["index"] == sm.applied

    asyncio.run(main())


def test_a_clean_of_broker_data_is_a_role_change_watchers_are_told():
    """CleanBrokerData can remove the master (Electra fences it with a new master epoch), drop sync-state-set
    members, or remove the whole set: watchers get each as a `role-change` with the set's role after it, live
    and on a resume, so nobody keeps following a master that no longer exists."""
    from electra.state import commands as C
    from electra.state.liveness import BrokerLiveInfo
    from electra.state.machine import ControllerStateMachine

    sm = ControllerStateMachine()
    node = SimpleNamespace(core=SimpleNamespace(term_at=lambda i: 1, committed_in_term=lambda: True),
                           is_leader=True, applied=0)
    w = W.Watchers(node, sm)  # type: ignore[arg-type]
    live = [BrokerLiveInfo(i, f"10.0.0.{i}:1", 1_000) for i in (1, 2)]
    cmds = [C.apply_broker_id("c1", "s", 1, "10.0.0.1:1;1"), C.apply_broker_id("c1", "s", 2, "10.0.0.2:1;2"),
            C.register_broker("c1", "s", 1, "10.0.0.1:1", 1_000, live),
            C.elect_master("c1", "s", 1, 1_000, live)]
    for i, data in enumerate(cmds, 1):
        node.applied = i
        sm.apply(i, data)
    q = w.subscribe("s")
    node.applied = 5
    sm.apply(5, C.clean_broker_data("c1", "s", [1], True, 2_000, live))
    ev = q.get_nowait()
    assert ev["type"] == "CleanBrokerData" and ev["index"] == 5
    assert ev["masterBrokerId"] is None and ev["masterEpoch"] == 2, ev
    assert [kind for kind, _ in asyncio.run(w.resume("s", 4))] == ["role-change"]
    node.applied = 6
    sm.apply(6, C.clean_broker_data("c1", "s", None, True, 2_000, live))  # the whole set
    ev = q.get_nowait()
    assert ev["type"] == "CleanBrokerData" and ev["index"] == 6 and ev["masterBrokerId"] is None
    assert [kind for kind, _ in asyncio.run(w.resume("s", 5))] == ["resync"]
