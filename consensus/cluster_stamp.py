"""The cluster id stamped in a node's data directory.

A data directory belongs to one cluster for life: the first start writes the cluster id to
`<data_dir>/cluster-id`, and a later start with another cluster id refuses, so a stale node from
another cluster cannot join a fresh one and impose its log. The id itself is generated when the
cluster is bootstrapped (with its CA: `electra cert create-ca`, `electra up`).
"""

from __future__ import annotations

import os
from pathlib import Path

STAMP = "cluster-id"


class ClusterIdMismatch(RuntimeError):
    pass


def check_cluster_stamp(data_dir: Path | str, cluster_id: str | None) -> str | None:
    """Stamp or check `data_dir`; return the cluster id this node runs with.

    No configured id: the stamped one is used (None if the directory was never stamped).
    """
    path = Path(data_dir) / STAMP
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
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(STAMP + ".tmp")
        with open(tmp, "w") as f:
            f.write(cluster_id + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    return cluster_id
