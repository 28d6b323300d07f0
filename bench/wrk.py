"""`wrk` (Debian's C HTTP load generator) as the benchmarks' saturating closed loop.

A Python load generator on this 2-core machine costs about as much CPU per request as the
controllers it measures, so a closed loop driven from Python measures the generator as much as
the servers. `wrk` costs a small fraction of that. Every script here ends with `DONE`, a Lua
`done()` that prints one `WRK_JSON {...}` line (requests, duration, errors, latency percentiles),
so callers read numbers, not wrk's human-readable summary.

`rotating_script(requests)` builds a script that sends a fixed list of requests round robin; each
request is formatted once per wrk thread (`init`), not once per send.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import resource
import shutil
import time
from pathlib import Path

from .common import process_tree_runqueue_wait_s

INSTALL_HINT = "`wrk` is missing: run `make test-tools` or `apt-get install -y wrk`"
TIMEOUT_S = 10  # wrk's per-request timeout: a request unanswered this long counts as a timeout error

DONE = """
function done(summary, latency, requests)
  local q = {}
  for i = 0, 199 do q[#q + 1] = string.format("%d", latency:percentile(i / 2)) end
  local e = summary.errors
  io.write(string.format(
    'WRK_JSON {"requests":%d,"duration_us":%d,"non_2xx":%d,"connect":%d,"read":%d,"write":%d,"timeout":%d,' ..
    '"p50_us":%d,"p99_us":%d,"cdf_us":[%s]}\\n',
    summary.requests, summary.duration, e.status, e.connect, e.read, e.write, e.timeout,
    latency:percentile(50), latency:percentile(99), table.concat(q, ",")))
end
"""


def _lua_string(text: str) -> str:
    """`text` as a Lua long-bracket literal (no escapes needed inside)."""
    level = 0
    while f"]{'=' * level}]" in text:
        level += 1
    return f"[{'=' * level}[{text}]{'=' * level}]"


def rotating_script(requests: list[tuple[str, str, str | None]], headers: dict[str, str] | None = None) -> str:
    """A wrk script sending `requests` ((method, path, JSON body or None)) round robin, each thread from its
    own starting point."""
    if not requests:
        raise ValueError("a rotating wrk script needs at least one request")
    spec = ",\n".join(f"  {{{_lua_string(m)}, {_lua_string(p)}, {_lua_string(b) if b is not None else 'nil'}}}"
                      for m, p, b in requests)
    hdrs = dict(headers or {})
    lua_headers = ", ".join(f"[{_lua_string(k)}] = {_lua_string(v)}" for k, v in hdrs.items())
    return f"""
local spec = {{
{spec}
}}
local reqs = {{}}
local n = 0
function init(args)
  for i, r in ipairs(spec) do
    local h = {{{lua_headers}}}
    if r[3] ~= nil then h["Content-Type"] = "application/json" end
    reqs[i] = wrk.format(r[1], r[2], h, r[3])
  end
  n = math.random(#reqs)
end
function request()
  n = n % #reqs + 1
  return reqs[n]
end
""" + DONE


def parse(out: str) -> dict:
    """The `WRK_JSON` line of a run: requests/s, latency (ms), failures."""
    line = next((x for x in out.splitlines() if x.startswith("WRK_JSON ")), None)
    if line is None:
        raise RuntimeError(f"wrk printed no result:\n{out[-2000:]}")
    raw = json.loads(line.removeprefix("WRK_JSON "))
    seconds = raw["duration_us"] / 1e6
    cdf = raw["cdf_us"]
    return {"requests": raw["requests"], "seconds": seconds,
            "rps": raw["requests"] / seconds if seconds > 0 else 0.0,
            "p50_ms": raw["p50_us"] / 1000, "p99_ms": raw["p99_us"] / 1000,
            "cdf": [(us / 1000, i / len(cdf)) for i, us in enumerate(cdf)],
            "non_2xx": raw["non_2xx"],
            "socket_errors": raw["connect"] + raw["read"] + raw["write"] + raw["timeout"]}


def command(url: str, script: Path, connections: int, duration_s: float, headers: dict[str, str] | None = None,
            threads: int = 2) -> list[str]:
    hdr = [a for k, v in (headers or {}).items() for a in ("-H", f"{k}: {v}")]
    return ["wrk", "-t", str(max(1, min(threads, connections))), "-c", str(connections), "-d",
            f"{max(1, round(duration_s))}s", "--timeout", f"{TIMEOUT_S}s", "-s", str(script), *hdr, url]


def available() -> bool:
    return shutil.which("wrk") is not None


async def run_async(url: str, script_text: str, connections: int, duration_s: float, workdir: Path) -> dict:
    """One wrk run beside the caller's event loop. Adds wrk's own CPU seconds (`cpu_s`, from the kernel's
    account of the reaped child) and its run-queue wait (`wait_s`, sampled while it runs)."""
    workdir.mkdir(parents=True, exist_ok=True)
    script = workdir / f"wrk-{abs(hash(script_text))}.lua"
    script.write_text(script_text)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = await asyncio.create_subprocess_exec(*command(url, script, connections, duration_s),
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    waited = 0.0

    async def sample_wait() -> None:
        nonlocal waited
        while True:
            waited = max(waited, process_tree_runqueue_wait_s(proc.pid, descendants=False))
            await asyncio.sleep(0.25)

    sampler = asyncio.create_task(sample_wait())
    try:
        async with asyncio.timeout(duration_s + TIMEOUT_S + 30):
            out, _ = await proc.communicate()
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise RuntimeError(f"wrk against {url} did not finish") from None
    except BaseException:  # cancelled (Ctrl-C, a sibling's failure): wrk must not load the machine on
        if proc.returncode is None:
            proc.kill()
            with contextlib.suppress(ProcessLookupError):
                await asyncio.shield(proc.wait())
        raise
    finally:
        sampler.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sampler
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    res = parse(out.decode(errors="replace"))
    res["cpu_s"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    res["wait_s"] = waited
    res["ended"] = time.monotonic()
    return res
