"""What a node's data directory belongs to: its cluster, its member, and the one process using it.

A data directory belongs to one cluster and one member for life:

* `<data_dir>/cluster-id`: the first start with a cluster id writes it, and a later start with
  another id refuses, so a stale node from another cluster cannot join a fresh one and impose its
  log. The id itself is generated when the cluster is bootstrapped (with its CA: `electra cert
  create-ca`, `electra up`). A directory that already holds a Raft log but no id (written by an
  `--insecure` node, or by another cluster) is not adopted silently either.
* `<data_dir>/member`: the node id and the ids of every member (`--peers`), written at the first
  start. A start as another node (its vote and log would be another member's), or with another set
  of members, refuses: Electra has no online reconfiguration, and a node restarted with a smaller
  peer list elects itself in a majority of its own (two leaders, conflicting writes). Peer
  addresses may change. Changing the members takes every node stopped first, then each started
  once with `--accept-new-peers`. A directory that holds a Raft log but no member record is not
  adopted under whatever `--id` this start gives (that log's term and vote may be another node's).
* `<data_dir>/LOCK`: an exclusive `flock` held by the process serving the directory (`electra
  node`), so a second process on the same directory refuses instead of writing the same log (two
  "replicas" on one disk).
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path

from electra.atomic_file import make_dirs, replace_file

from .files import Files

STAMP = "cluster-id"
MEMBER = "member"
LOCK = "LOCK"


class ClusterIdMismatch(RuntimeError):
    pass


class MemberMismatch(RuntimeError):
    pass


class DataDirInUse(RuntimeError):
    pass


class RejoinRefused(RuntimeError):
    """`--rejoin` cannot be honoured on this data dir or group (the reason says what to do)."""


def _holds_raft_state(data_dir: Path) -> bool:
    for sub in ("raft-log", "snapshots"):
        try:
            if any(os.scandir(data_dir / sub)):
                return True
        except (FileNotFoundError, NotADirectoryError):
            continue
    return False


def _write_durably(path: Path, text: str) -> None:
    make_dirs(path.parent)
    replace_file(path, text.encode())


def check_cluster_stamp(data_dir: Path | str, cluster_id: str | None) -> str | None:
    """Stamp or check `data_dir`; return the cluster id this node runs with.

    No configured id: the stamped one is used (None if the directory was never stamped).
    """
    data_dir = Path(data_dir)
    path = data_dir / STAMP
    try:
        stamped = path.read_text().strip() or None
    except FileNotFoundError:
        stamped = None
    if cluster_id is None:
        return stamped
    if stamped is not None and stamped != cluster_id:
        raise ClusterIdMismatch(f"data directory {data_dir} belongs to cluster id {stamped!r}, not {cluster_id!r}; "
                                "refusing to start (point --data-dir at this cluster's directory, or wipe it to "
                                "join this cluster as a new member)")
    if stamped is None:
        if _holds_raft_state(data_dir):
            raise ClusterIdMismatch(
                f"data directory {data_dir} holds a Raft log but no cluster id (it was written by an --insecure "
                f"node or by another cluster); refusing to adopt it into cluster {cluster_id!r}. If it is this "
                f"cluster's, write {cluster_id} to {path}; otherwise point --data-dir elsewhere or empty it")
        _write_durably(path, cluster_id + "\n")
    return cluster_id


def check_member_stamp(data_dir: Path | str, node_id: int, members: list[int], *, accept_new: bool = False) -> None:
    """Stamp `data_dir` with this node's id and the members' ids, or check them (see the module docstring)."""
    data_dir = Path(data_dir)
    path = data_dir / MEMBER
    want = {"node_id": node_id, "members": sorted(members)}
    try:
        stamped = json.loads(path.read_text())
        recorded = True
    except FileNotFoundError:
        stamped, recorded = None, False
    except (OSError, ValueError) as exc:
        raise MemberMismatch(f"cannot read {path}: {exc}") from None
    if recorded and not (
            isinstance(stamped, dict) and type(stamped.get("node_id")) is int
            and isinstance(stamped.get("members"), list) and all(type(m) is int for m in stamped["members"])):
        raise MemberMismatch(f"{path} is not a member record ({{\"node_id\": N, \"members\": [...]}}); refusing to "
                             "start. If this is the node's own data dir, delete that file: the next start records "
                             "the node again")
    if stamped is None and _holds_raft_state(data_dir):
        # Its log holds some node's term and vote: adopted under another id, that node could vote twice in a term.
        raise MemberMismatch(
            f"data directory {data_dir} holds a Raft log but no member record, so which node wrote it is unknown; "
            f"refusing to adopt it as node {node_id}. If it is node {node_id}'s own, write "
            f"{json.dumps(want)} to {path}; otherwise point --data-dir elsewhere")
    if stamped is not None and stamped.get("node_id") != node_id:
        raise MemberMismatch(f"data directory {data_dir} belongs to node {stamped.get('node_id')}, not node {node_id}; "
                             "refusing to start (each node needs its own data directory)")
    if stamped is not None and stamped.get("members") != want["members"] and not accept_new:
        raise MemberMismatch(
            f"data directory {data_dir} was started with members {stamped.get('members')}, and this start names "
            f"{want['members']}; refusing to start. Electra has no online reconfiguration: a node started with "
            "other members can form a majority of its own. To change the members, stop every node, then start "
            "each once with --accept-new-peers and the new --peers")
    if stamped != want:
        _write_durably(path, json.dumps(want) + "\n")


def lock_data_dir(data_dir: Path | str) -> int:
    """Take `<data_dir>/LOCK` for this process (the returned descriptor holds it until the process exits)."""
    data_dir = Path(data_dir)
    make_dirs(data_dir)  # durably: the log written into it later must not lose its directory on a power loss
    fd = os.open(data_dir / LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        try:
            raise _in_use(data_dir, fd) from None
        finally:
            os.close(fd)
    try:  # who holds it, for the refusal above; a full disk must not stop a restart here
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
    except OSError:
        pass
    if not os.access(data_dir, os.W_OK | os.X_OK):  # a read-only directory failed on every sync, after starting
        os.close(fd)
        raise DataDirInUse(f"data directory {data_dir} is not writable by this user; refusing to start")
    return fd


def check_data_dir_free(data_dir: Path | str) -> None:
    """Raise DataDirInUse if a process holds `<data_dir>/LOCK`, as `lock_data_dir` would, but take nothing and
    create nothing: `electra up` asks before it starts anything, and leaves the lock to the node it starts."""
    data_dir = Path(data_dir)
    try:
        fd = os.open(data_dir / LOCK, os.O_RDONLY)
    except (FileNotFoundError, NotADirectoryError):
        return  # never served (or not a directory: the node says so)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # released with the descriptor
    except BlockingIOError:
        raise _in_use(data_dir, fd) from None
    finally:
        os.close(fd)


def _in_use(data_dir: Path, fd: int) -> DataDirInUse:
    """The refusal naming the lock's holder, whose pid it wrote into the file."""
    holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
    return DataDirInUse(f"data directory {data_dir} is in use by another process (pid {holder}); refusing "
                        "to start (two processes on one directory would write the same log)")


def mark_rejoining(data_dir: Path | str, *, fsync: bool = True, files: Files | None = None) -> bool:
    """`electra node --rejoin`: an emptied data dir starts with the rejoin vote floor (`core.REJOIN_FLOOR`),
    durably, so the node neither votes nor campaigns until a current leader has brought it up to that
    leader's last index (`RaftCore._learn_floor`, after its term probe). A node restored empty has forgotten
    the entries it acknowledged, its term and its vote: started plainly, it could elect a candidate that
    misses committed entries, acknowledge a stale leader, or vote twice in one term.

    Returns False (and writes nothing) when the directory already holds Raft state: a node restarted with
    the flag still set keeps the floor it has (learned, or still the rejoin floor)."""
    from . import mutations
    from .core import REJOIN_FLOOR
    from .storage import LogStorage, term_mark_path

    data_dir = Path(data_dir)
    if _holds_raft_state(data_dir):
        return False
    mark = term_mark_path(data_dir / "raft-log")  # the removed log's mark of how far it had durably reached
    if files is None and mark.exists():
        raise RejoinRefused(f"{mark} belongs to the Raft log that was removed from {data_dir}: move it aside too "
                           "(or the whole data dir) before starting with --rejoin")
    storage = LogStorage(data_dir / "raft-log", fsync=fsync, files=files)
    storage.open()
    try:
        if not mutations.enabled("rejoin_without_floor"):  # the deliberate bug: start empty, as before --rejoin
            storage.save_vote_floor(*REJOIN_FLOOR)
        storage.sync()
    finally:
        storage.close()
    return True
