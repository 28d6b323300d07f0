"""The audit log: one JSON line per admin action (who, what, outcome), in the data dir and the log.

Each record is flushed and fsynced before the response leaves, so an admin action the caller saw
answered is never missing from the file after a crash. Refused attempts (401/403) are recorded too.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path

log = logging.getLogger("electra.audit")


class AuditLog:
    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._f = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - open for the node's life
        self.failures = 0  # records the file did not take (a full disk): they are in the node's log only

    def record(self, *, who: str, role: str | None, action: str, status: int, code: int | None,
               remote: str | None = None, detail: str | None = None) -> dict:
        rec = {"ts": round(time.time(), 3), "who": who, "role": role, "action": action,
               "outcome": "ok" if status < 300 and code in (0, None) else "refused" if status in (401, 403)
               else "redirected" if status in (307, 308) else "failed", "status": status, "code": code}
        if remote:
            rec["remote"] = remote
        if detail:
            rec["detail"] = detail
        line = json.dumps(rec, separators=(",", ":"))
        try:
            with self._lock:
                self._f.write(line + "\n")
                self._f.flush()
                os.fsync(self._f.fileno())
        except OSError as exc:
            # The action already happened (its outcome is what is recorded): the answer still goes out whole,
            # and the record is kept in the node's log at least, marked as missing from the file.
            self.failures += 1
            log.error("audit record NOT written to %s (%s): %s", self.path, exc, line)
            return rec
        log.info("audit %s", line)
        return rec

    def close(self) -> None:
        with self._lock:
            self._f.close()
