"""Mutual TLS between Raft peers: identity from the certificate, cluster id on every connection and in the data dir."""

from __future__ import annotations

import asyncio
import logging
import ssl

import msgpack
import pytest

from electra.consensus.data_dir_claims import ClusterIdMismatch, check_cluster_stamp
from electra.consensus.framing import pack_frame
from electra.consensus.messages import Append, Heartbeat, Message
from electra.consensus.peer_identity import identity_from_peercert, node_uri
from electra.consensus.transport import PROTO, PeerTransport
from electra.local_ports import free_ports
from electra.security.pki import cert_node_identity, create_ca, create_node_cert, read_cluster_id
from electra.security.tls import NodeTLS


async def _until(cond, timeout=10.0):
    deadline = asyncio.get_running_loop().time() + timeout
    while not cond():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """The cluster's CA with nodes 1-3; a second CA; a node-1 cert of the same CA for another cluster id."""
    base = tmp_path_factory.mktemp("pki")
    good = base / "good"
    cid = create_ca(good)
    for i in (1, 2, 3):
        create_node_cert(good, i, ["127.0.0.1"])
    other = base / "other"
    create_ca(other)
    create_node_cert(other, 1, ["127.0.0.1"])
    # same CA key, another cluster id (e.g. a CA shared by two clusters)
    (good / "cluster-id").write_text("another-cluster\n")
    create_node_cert(good, 1, ["127.0.0.1"], out_dir=base / "foreign")
    (good / "cluster-id").write_text(cid + "\n")
    return {"good": good, "other": other, "foreign": base / "foreign", "cid": cid}


def _tls(d, i, ca_dir=None):
    return NodeTLS(d / f"node-{i}.crt", d / f"node-{i}.key", (ca_dir or d) / "ca.crt")


def test_certificates_name_cluster_and_node(pki):
    assert cert_node_identity(pki["good"] / "node-2.crt") == (pki["cid"], 2)
    assert cert_node_identity(pki["foreign"] / "node-1.crt") == ("another-cluster", 1)
    assert read_cluster_id(pki["good"]) == pki["cid"]
    assert identity_from_peercert({"subjectAltName": (("URI", node_uri("c1", 7)), ("DNS", "x"))}) == ("c1", 7)
    with pytest.raises(ValueError):
        identity_from_peercert({"subjectAltName": (("DNS", "node-1"),)})
    with pytest.raises(ValueError):
        identity_from_peercert(None)


def test_data_dir_stamped_with_another_cluster_id_refuses(tmp_path):
    assert check_cluster_stamp(tmp_path, None) is None
    assert check_cluster_stamp(tmp_path, "a") == "a"
    assert check_cluster_stamp(tmp_path, None) == "a"  # the stamp is the default afterwards
    assert check_cluster_stamp(tmp_path, "a") == "a"
    with pytest.raises(ClusterIdMismatch, match="belongs to cluster id 'a'"):
        check_cluster_stamp(tmp_path, "b")


def _cluster(pki):
    ports = free_ports(3)
    peers = {i + 1: ("127.0.0.1", p) for i, p in enumerate(ports)}
    inbox = {i: [] for i in peers}
    ts = {}
    for i in peers:
        tls = _tls(pki["good"], i)
        ts[i] = PeerTransport(i, peers, inbox[i].append, cluster_id=pki["cid"],
                              server_ssl=tls.peer_server_context(), client_ssl=tls.peer_client_context())
    return peers, inbox, ts


async def _forge(host, port, ssl_ctx, hello: dict, msg: Message) -> bytes:
    """Connect (TLS if given), send a handshake and one message; return what the node answered before closing."""
    try:
        r, w = await asyncio.wait_for(asyncio.open_connection(host, port, ssl=ssl_ctx), 5)
    except (ssl.SSLError, OSError):
        return b"<tls refused>"
    try:
        w.write(pack_frame(msgpack.packb(hello)) + pack_frame(msg.encode()))
        return await asyncio.wait_for(r.read(), 5)
    except (ssl.SSLError, OSError):
        return b"<tls refused>"
    finally:
        w.close()


def test_forged_peers_are_refused_and_nothing_reaches_raft(pki, caplog):
    caplog.set_level(logging.WARNING, logger="electra.consensus.transport")

    async def main():
        peers, inbox, ts = _cluster(pki)
        for t in ts.values():
            await t.start()
        try:
            await _until(lambda: all(t.connected(p) for i, t in ts.items() for p in peers if p != i))
            host, port = peers[2]
            forged = Append(1, 2, 99, prev_index=0, ent_terms=[99], ent_data=[b"evil"], commit=1)
            hello = {"proto": PROTO, "cluster": "electra", "cluster_id": pki["cid"], "from": 1, "to": 2}
            before = ts[2].stats["rejected_handshakes"]
            # 1. plaintext, no certificate at all
            r, w = await asyncio.open_connection(host, port)
            w.write(pack_frame(msgpack.packb(hello)) + pack_frame(forged.encode()))
            assert await asyncio.wait_for(r.read(), 5) == b""  # the TLS handshake fails on a plaintext hello
            w.close()
            # 2. a certificate from another CA
            await _forge(host, port, _tls(pki["other"], 1, pki["good"]).peer_client_context(), hello, forged)
            # 3. a valid certificate of node 3 claiming to be node 1
            assert await _forge(host, port, _tls(pki["good"], 3).peer_client_context(), hello, forged) == b""
            # 4. a certificate of this CA for another cluster id, handshake with ours or its own
            foreign = _tls(pki["foreign"], 1, pki["good"]).peer_client_context()
            assert await _forge(host, port, foreign, hello, forged) == b""
            assert await _forge(host, port, foreign, hello | {"cluster_id": "another-cluster"}, forged) == b""
            await _until(lambda: ts[2].stats["rejected_handshakes"] >= before + 5)
            assert not any(m.term == 99 for m in inbox[2]), "a forged message reached Raft"
            text = caplog.text
            assert "TLS handshake failed" in text
            assert "names node 3 but the handshake claims node 1" in text
            assert "cluster id 'another-cluster'" in text
            # the real members still talk
            n = len(inbox[2])
            await _until(lambda: (ts[1].send(Heartbeat(1, 2, 1)) or len(inbox[2]) > n))
        finally:
            for t in ts.values():
                await t.stop()

    asyncio.run(asyncio.wait_for(main(), 60))


def test_plaintext_node_cannot_join_a_tls_cluster_and_cluster_ids_must_match(pki):
    async def main():
        ports = free_ports(2)
        peers = {1: ("127.0.0.1", ports[0]), 2: ("127.0.0.1", ports[1])}
        tls = _tls(pki["good"], 2)
        secure = PeerTransport(2, peers, lambda m: None, cluster_id=pki["cid"],
                               server_ssl=tls.peer_server_context(), client_ssl=tls.peer_client_context())
        plain = PeerTransport(1, peers, lambda m: None, cluster_id=pki["cid"])
        await secure.start()
        await plain.start()
        try:
            await _until(lambda: secure.stats["rejected_handshakes"] >= 2)
            assert not secure.connected(1) and not plain.connected(2)
        finally:
            await plain.stop()
            await secure.stop()
        # insecure mode still checks the cluster id of the handshake
        a = PeerTransport(2, peers, lambda m: None, cluster_id="fresh")
        b = PeerTransport(1, peers, lambda m: None, cluster_id="stale")
        await a.start()
        await b.start()
        try:
            await _until(lambda: a.stats["rejected_handshakes"] >= 2)
            assert not a.connected(1)
        finally:
            await b.stop()
            await a.stop()

    asyncio.run(asyncio.wait_for(main(), 60))


def test_transport_needs_both_contexts_or_none(pki):
    tls = _tls(pki["good"], 1)
    with pytest.raises(ValueError, match="both SSL contexts"):
        PeerTransport(1, {1: ("127.0.0.1", 1)}, lambda m: None, server_ssl=tls.peer_server_context())


def test_rotated_node_certificate_is_reloaded_into_the_live_contexts(pki, tmp_path):
    import shutil

    d = tmp_path / "rot"
    shutil.copytree(pki["good"], d)
    tls = _tls(d, 1)
    ctx = tls.peer_server_context()
    assert not tls.reload_if_changed()
    before = ctx.cert_store_stats()["x509_ca"]
    create_ca(d, overwrite=True)  # CA rollover: the bundle now holds the new and the old CA
    create_node_cert(d, 1, ["127.0.0.1"])
    assert tls.reload_if_changed()
    assert ctx.cert_store_stats()["x509_ca"] == before + 1


def test_a_file_replaced_while_its_change_is_checked_does_not_end_the_reloads(pki, tmp_path, monkeypatch):
    """Review: the check asked `exists()` and then stat'ed the file; a rotation that replaces the file between the
    two raised FileNotFoundError, which ended the watch task and with it every later reload."""
    import os
    import pathlib
    import shutil

    d = tmp_path / "rot"
    shutil.copytree(pki["good"], d)
    tls = _tls(d, 1)
    tls.peer_server_context()
    key = tls.key
    os.rename(key, f"{key}.old")  # the rotation's first step: the key is gone ...
    real_exists = pathlib.Path.exists
    monkeypatch.setattr(pathlib.Path, "exists", lambda self: True if self == key else real_exists(self))
    assert not tls.reload_if_changed()  # ... just after it was seen (a half-written rotation: nothing reloaded)
    monkeypatch.undo()
    os.rename(f"{key}.old", key)
    create_node_cert(d, 1, ["127.0.0.1"])
    assert tls.reload_if_changed()


def test_a_data_dir_belongs_to_one_member_and_one_process(tmp_path):
    """QA: a node restarted with only itself in --peers elected itself (two leaders); `--id 2` on node 3's data
    dir was accepted; two processes wrote one log. Each now refuses with the reason."""
    import os

    from electra.consensus.data_dir_claims import (
        DataDirInUse,
        MemberMismatch,
        check_member_stamp,
        lock_data_dir,
    )

    d = tmp_path / "n3"
    check_member_stamp(d, 3, [1, 2, 3])
    check_member_stamp(d, 3, [3, 2, 1])  # the same members in another order
    with pytest.raises(MemberMismatch, match="belongs to node 3, not node 2"):
        check_member_stamp(d, 2, [1, 2, 3])
    with pytest.raises(MemberMismatch, match=r"started with members \[1, 2, 3\].*names \[3\]"):
        check_member_stamp(d, 3, [3])
    for junk in ("[]", "1", '"x"', "null", '{"node_id": "3", "members": [1, 2, 3]}', "{not json"):
        (tmp_path / "junk").mkdir(exist_ok=True)
        (tmp_path / "junk" / "member").write_text(junk)
        with pytest.raises(MemberMismatch, match="member record|cannot read"):
            check_member_stamp(tmp_path / "junk", 3, [1, 2, 3])
    unstamped = tmp_path / "unstamped"  # some node's log without the record of which node wrote it
    (unstamped / "raft-log").mkdir(parents=True)
    (unstamped / "raft-log" / "00000000000000000001.seg").write_bytes(b"x")
    with pytest.raises(MemberMismatch, match="holds a Raft log but no member record.*as node 2. If it is node 2's"):
        check_member_stamp(unstamped, 2, [1, 2, 3])
    assert not (unstamped / "member").exists()
    (unstamped / "member").write_text('{"node_id": 2, "members": [1, 2, 3]}')  # what the refusal says to do
    check_member_stamp(unstamped, 2, [1, 2, 3])
    check_member_stamp(d, 3, [1, 2, 3, 4, 5], accept_new=True)  # every node stopped, then restarted once so
    check_member_stamp(d, 3, [1, 2, 3, 4, 5])
    fd = lock_data_dir(d)
    try:
        with pytest.raises(DataDirInUse, match=f"pid {os.getpid()}"):
            lock_data_dir(d)
    finally:
        os.close(fd)
    os.close(lock_data_dir(d))  # free again once the holder is gone


def test_a_secure_node_does_not_adopt_an_unstamped_raft_log(tmp_path):
    (tmp_path / "raft-log").mkdir()
    (tmp_path / "raft-log" / "00000000000000000001.seg").write_bytes(b"x")
    with pytest.raises(ClusterIdMismatch, match="holds a Raft log but no cluster id"):
        check_cluster_stamp(tmp_path, "prod")
    assert not (tmp_path / "cluster-id").exists()
    assert check_cluster_stamp(tmp_path, None) is None  # an insecure node without an id: as before


@pytest.mark.parametrize("secure_id", [1, 2])
def test_tls_and_insecure_members_refuse_each_other_and_say_why_once(pki, caplog, secure_id):
    """A group started half with certificates and half --insecure: both sides name the mistake (the lower id
    dials), and the dials repeated several times a second are logged once each, not once per dial."""
    caplog.set_level(logging.WARNING, logger="electra.consensus.transport")

    async def main():
        ports = free_ports(2)
        peers = {1: ("127.0.0.1", ports[0]), 2: ("127.0.0.1", ports[1])}
        ts = {}
        for i in peers:
            tls = _tls(pki["good"], i) if i == secure_id else None
            ts[i] = PeerTransport(i, peers, lambda m: None, cluster_id=pki["cid"],
                                  server_ssl=tls.peer_server_context() if tls else None,
                                  client_ssl=tls.peer_client_context() if tls else None)
            await ts[i].start()
        try:
            await _until(lambda: ts[2].stats["rejected_handshakes"] >= 5)
            assert not ts[1].connected(2) and not ts[2].connected(1)
        finally:
            for t in ts.values():
                await t.stop()

    asyncio.run(asyncio.wait_for(main(), 30))
    lines = [r.getMessage() for r in caplog.records]
    refusals = [m for m in lines if m.startswith("node 2: rejected connection")]
    hints = {1: "a TLS handshake arrived: the peer runs with TLS certificates and this node with --insecure",
             2: "the peer spoke plaintext: it runs --insecure"}
    assert len(refusals) == 1 and hints[secure_id] in refusals[0], lines
    dialer = [m for m in lines if m.startswith("node 1: node 2 closed the connection during the handshake")]
    assert len(dialer) == 1, lines


def test_an_http_request_on_the_raft_port_is_named(caplog):
    caplog.set_level(logging.WARNING, logger="electra.consensus.transport")

    async def main():
        port = free_ports(1)[0]
        t = PeerTransport(1, {1: ("127.0.0.1", port)}, lambda m: None)
        await t.start()
        try:
            r, w = await asyncio.open_connection("127.0.0.1", port)
            w.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            assert await asyncio.wait_for(r.read(), 5) == b""
            w.close()
        finally:
            await t.stop()

    asyncio.run(asyncio.wait_for(main(), 10))
    assert any("an HTTP request arrived on the Raft peer port" in r.getMessage() for r in caplog.records)


def test_every_tls_listener_refuses_versions_older_than_1_2(pki):
    """One floor for every context, set by Electra (the ingest's HTTPS context relied on Python's default, which is
    1.2 since 3.10 but is a build setting), and one error naming the files that could not be loaded."""
    import ssl

    from electra.security.tls import server_context

    d = pki["good"]
    tls = _tls(d, 1)
    contexts = [server_context(d / "node-1.crt", d / "node-1.key"), tls.http_server_context(),
                tls.peer_server_context(), tls.peer_client_context()]
    assert [c.minimum_version for c in contexts] == [ssl.TLSVersion.TLSv1_2] * 4
    with pytest.raises(ValueError, match=f"^cannot load TLS files {d}/node-2.crt, {d}/node-1.key: "):
        server_context(d / "node-2.crt", d / "node-1.key")


def test_rejoin_stores_the_rejoin_floor_in_an_empty_data_dir_only(tmp_path):
    from electra.consensus.core import REJOIN_FLOOR
    from electra.consensus.data_dir_claims import mark_rejoining
    from electra.consensus.storage import LogStorage

    def floor(d):
        s = LogStorage(d / "raft-log", fsync=False)
        try:
            return s.open().vote_floor
        finally:
            s.close()

    assert mark_rejoining(tmp_path / "emptied", fsync=False) is True
    assert floor(tmp_path / "emptied") == REJOIN_FLOOR  # durably, before the node starts
    assert mark_rejoining(tmp_path / "emptied", fsync=False) is False  # restarted with the flag still set
    used = tmp_path / "used"
    s = LogStorage(used / "raft-log", fsync=False)
    s.open()
    s.save_hard_state(3, 1)
    s.append(1, [3], [b"x"])
    s.sync()
    s.close()
    assert mark_rejoining(used, fsync=False) is False and floor(used) == (0, 0)
