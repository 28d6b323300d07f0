"""`/docs` renders Swagger UI in a real browser with nothing from the network but the node itself.

Headless Chromium (Debian's) against one secure `electra node` process, every request to another
host refused: FastAPI's stock page loads its scripts from a CDN and rendered blank on a host without
Internet access (api/api_docs.py).
"""

from __future__ import annotations

import ssl
import time
import urllib.error
import urllib.request

import pytest
from test_dashboard_browser import chromium_path

from electra.bench.common import bench_credentials, start_controller_processes, stop_processes

pytestmark = pytest.mark.integration


def _get(url: str, ca: str) -> tuple[int, bytes, str]:
    ctx = ssl.create_default_context(cafile=ca)
    try:
        with urllib.request.urlopen(url, context=ctx, timeout=10) as r:
            return r.status, r.read(), r.headers.get("content-type", "")
    except urllib.error.HTTPError as e:
        return e.code, e.read(), e.headers.get("content-type", "")


def test_swagger_ui_renders_from_the_node_alone(tmp_path):
    from playwright.sync_api import expect, sync_playwright

    procs, endpoints = start_controller_processes(tmp_path, nodes=1)
    ep = endpoints[0]
    ca = str(bench_credentials(tmp_path).ca_file)
    try:
        deadline = time.monotonic() + 30
        while True:  # the node's HTTP server is up (bounded)
            try:
                _get(f"https://{ep}/healthz", ca)
                break
            except (urllib.error.URLError, OSError):
                assert time.monotonic() < deadline, "the node did not start"
                time.sleep(0.2)
        # public, as /openapi.json is (no token); only the page's own files, each with its type
        status, page, _ = _get(f"https://{ep}/docs", ca)
        assert status == 200 and b"/docs/static/swagger-ui-bundle.js" in page and b"cdn" not in page.lower()
        for name, kind in (("swagger-ui-bundle.js", "javascript"), ("swagger-ui.css", "text/css"),
                           ("favicon.png", "image/png")):
            status, body, ctype = _get(f"https://{ep}/docs/static/{name}", ca)
            assert status == 200 and kind in ctype and len(body) > 100, (name, status, ctype)
        status, body, _ = _get(f"https://{ep}/docs/static/index.html", ca)
        assert status == 404 and b'"code":3' in body.replace(b" ", b"")
        assert _get(f"https://{ep}/redoc", ca)[0] in (401, 404)  # gone: its page came from a CDN too
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium_path(), headless=True,
                                         args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
            try:
                context = browser.new_context(ignore_https_errors=True)
                elsewhere: list[str] = []

                def only_the_node(route):
                    if route.request.url.startswith(f"https://{ep}/"):
                        route.continue_()
                    else:
                        elsewhere.append(route.request.url)
                        route.abort()

                context.route("**/*", only_the_node)
                page = context.new_page()
                errors: list[str] = []
                page.on("pageerror", lambda exc: errors.append(str(exc)))
                page.goto(f"https://{ep}/docs")
                expect(page.locator(".swagger-ui .info .title")).to_contain_text("Electra controller", timeout=20_000)
                expect(page.locator(".opblock-summary-path", has_text="/v1/broker-sets/{name}/watch")).to_be_visible()
                assert page.locator(".opblock").count() >= 15
                page.screenshot(path=str(tmp_path / "docs.png"), full_page=True)
                assert not elsewhere, elsewhere
                assert not errors, errors
            finally:
                browser.close()
    finally:
        stop_processes(procs)
