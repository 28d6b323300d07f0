"""The dashboard in a real browser: headless Chromium (Debian's) against 3 `electra node` processes.

Simulated brokers (`electra simulate-brokers`, over real HTTP) fill the fleet; a master is
killed and the failover must appear on a follower's dashboard page, fed live by its SSE
stream, within a bound; the set's page then shows its history from the Delta tier.
Screenshots are saved under the test's tmp dir (paths printed; `pytest -s` shows them).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest

from electra.api.client import ControllerClient
from electra.bench.common import bench_credentials, start_controller_processes, stop_processes

pytestmark = pytest.mark.integration

FAILOVER_BOUND_S = 30  # heartbeat timeout 1.5 s + scan 0.5 s + commit, with a wide margin for a loaded machine


def chromium_path() -> str:
    path = os.environ.get("ELECTRA_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    assert path, "the dashboard test needs Debian's chromium: `make test-tools` installs it (apt-get install chromium)"
    return path


def _leader_and_follower(endpoints: list[str], credentials) -> tuple[str, str]:
    async def main():
        client = ControllerClient(endpoints, timeout=2, credentials=credentials)
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                roles = {}
                for ep in endpoints:
                    with contextlib.suppress(Exception):  # not up yet
                        roles[ep] = (await client.metadata(ep))["role"]
                if "leader" in roles.values() and list(roles.values()).count("follower") >= 1:
                    return (next(e for e, r in roles.items() if r == "leader"),
                            next(e for e, r in roles.items() if r == "follower"))
                await asyncio.sleep(0.2)
            raise AssertionError("no leader within 30 s")
        finally:
            await client.close()

    return asyncio.run(main())


class _Lines:
    """The simulator's stdout, read in a thread so the test can wait for a line with a bound."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._pump, args=(proc,), daemon=True)
        self._thread.start()

    def _pump(self, proc: subprocess.Popen) -> None:
        for raw in proc.stdout:
            self.lines.append(raw.decode(errors="replace").rstrip())

    def wait_for(self, text: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in self.lines:
                if text in line:
                    return line
            time.sleep(0.1)
        raise AssertionError(f"no line with {text!r} within {timeout}s:\n" + "\n".join(self.lines[-20:]))


def test_a_killed_master_appears_on_a_followers_dashboard(tmp_path):
    from playwright.sync_api import expect, sync_playwright

    procs, endpoints = start_controller_processes(
        tmp_path, ("--tick-ms", "50", "--inactive-master-scan-ms", "500", "--tier-uri", str(tmp_path / "tier")))
    sim = None
    shots = tmp_path / "screenshots"
    shots.mkdir()
    creds = bench_credentials(tmp_path)  # the nodes are secure: HTTPS and role tokens
    try:
        _, follower = _leader_and_follower(endpoints, creds.credentials("admin"))
        sim = subprocess.Popen([sys.executable, "-m", "electra.cli", "simulate-brokers", "--endpoints",
                                ",".join(endpoints), "--groups", "4", "--heartbeat-timeout-ms", "1500"],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               env={**os.environ, **creds.env("broker")})
        out = _Lines(sim)
        out.wait_for("registered in", timeout=60)
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium_path(), headless=True,
                                         args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
            try:
                # An operator's browser: trusts the cluster CA (here: ignores the local chain) and has no
                # way to put a bearer token on requests; it signs in the way a person does.
                context = browser.new_context(viewport={"width": 1400, "height": 1100}, ignore_https_errors=True)
                page = context.new_page()
                errors: list[str] = []
                page.on("pageerror", lambda exc: errors.append(str(exc)))
                observer = creds.token_file("observer").read_text().strip()
                page.goto(f"https://{follower}/dashboard")  # no token: the form
                expect(page.locator("#login")).to_be_visible(timeout=15_000)
                expect(page.locator("#overview")).to_be_hidden()
                page.fill("#token", "not-a-token")
                page.click("#login-form button")
                expect(page.locator("#login-error")).to_contain_text("invalid", timeout=10_000)
                page.fill("#token", observer)
                page.click("#login-form button")
                expect(page.locator("#conn")).to_have_text("live", timeout=15_000)
                expect(page.locator("#who")).to_contain_text("observer")
                cookie = next(c for c in context.cookies() if c["name"].startswith("__Host-electra"))
                assert cookie["httpOnly"] and cookie["secure"] and cookie["sameSite"] == "Strict"
                assert page.evaluate("document.cookie") == ""  # no script reads it
                page.click("#logout")
                expect(page.locator("#login")).to_be_visible(timeout=10_000)
                assert not [c for c in context.cookies() if c["name"].startswith("__Host-electra")]
                # What `electra up` prints: the token in the fragment, exchanged for the cookie, then
                # gone from the address bar.
                page.goto(f"https://{follower}/dashboard#token={observer}")
                expect(page.locator("#conn")).to_have_text("live", timeout=15_000)
                assert "token" not in page.url
                expect(page.locator("#live_master")).to_have_text("4", timeout=30_000)
                expect(page.locator("#group tbody tr")).to_have_count(3, timeout=10_000)
                page.screenshot(path=str(shots / "1-before.png"), full_page=True)

                sim.stdin.write(b"kill-master sim-set-1\n")
                sim.stdin.flush()
                killed = out.wait_for("killed master", timeout=10)
                t_kill = time.monotonic()
                row = page.locator('#failovers tbody tr[data-set="sim-set-1"]')
                expect(row).to_have_count(1, timeout=FAILOVER_BOUND_S * 1000)
                seen_after = time.monotonic() - t_kill
                old = killed.split()[2]
                assert row.get_attribute("data-old") == old and row.get_attribute("data-new") not in ("", old)
                expect(page.locator("#live_master")).to_have_text("4", timeout=15_000)  # the new master heartbeats
                page.screenshot(path=str(shots / "2-failover.png"), full_page=True)
                print(f"\nfailover on the page {seen_after:.1f} s after the kill; screenshots in {shots}")

                row.locator("a").click()
                expect(page.locator("#setname")).to_have_text("sim-set-1")
                expect(page.locator("#setbody")).to_contain_text("ElectMaster", timeout=30_000)  # the tier's history
                page.screenshot(path=str(shots / "3-set-page.png"), full_page=True)
                # The serving node hangs (its connection stays open, no frame comes): the page says it is
                # stale instead of "live"; once the node runs again, live again.
                serving = procs[endpoints.index(follower)]
                os.kill(serving.pid, signal.SIGSTOP)
                try:
                    expect(page.locator("#conn")).to_contain_text("stale", timeout=15_000)
                finally:
                    os.kill(serving.pid, signal.SIGCONT)
                expect(page.locator("#conn")).to_have_text("live", timeout=30_000)
                assert errors == [], errors
            finally:
                browser.close()
        line = out.wait_for("failover sim-set-1: master", timeout=15)  # the demo's own report
        assert f"master {old} -> " in line and "s after the kill" in line
        print(f"simulator: {line}")
    finally:
        if sim is not None and sim.poll() is None:
            sim.stdin.close()
            sim.terminate()
            sim.wait(timeout=10)
        stop_processes(procs)
    for name in ("1-before.png", "2-failover.png", "3-set-page.png"):
        assert (shots / name).stat().st_size > 10_000
