"""`evolver ui`, the live dashboard: who may read it, and what a person sees in a real browser.

The guard is tested on the app itself (no daemon behind it: the daemon-down
answer is part of what is tested). The page is tested end to end: a real
daemon, a real `evolver ui` process, and Chromium from the distribution's
packages driven by Selenium, headless. Its screenshots are kept in
test-artifacts/dashboard/ (or $TEST_ARTIFACTS_DIR).

CI installs Chromium and its driver and sets CI, and there the browser test
never skips; elsewhere it skips, saying what to install.
"""

from __future__ import annotations

import base64
import os
import re
import shutil
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from _helpers import REPO, read_line
from starlette.testclient import TestClient

from evolver.cli.client import finished_rounds
from evolver.meta import packs
from evolver.testing.daemon import (
    SLOW_STEP,
    DaemonProcess,
    demo_rules,
    make_root,
    serving,
    wait_for,
    write_script,
)
from evolver.ui.app import cookie_name, create_ui_app
from evolver.ui.serve import bind_loopback
from memory import Store
from tests.test_cli import EVOLVER

PORT = 48123
TOKEN = "t0k3n-for-the-test"


@pytest.fixture
def page(tmp_path) -> TestClient:
    """The dashboard over a socket where no daemon listens, at the address it would print."""
    app = create_ui_app(str(tmp_path / "no-daemon.sock"), token=TOKEN, port=PORT)
    return TestClient(app, base_url=f"http://127.0.0.1:{PORT}", follow_redirects=False)


def _authorized(page: TestClient) -> TestClient:
    """The client after opening the printed URL: it holds the session cookie."""
    assert page.get(f"/?token={TOKEN}").status_code == 303
    return page


def test_without_its_token_nothing_is_served(page):
    for path in (
        "/",
        "/static/app.js",
        "/tree.html",
        "/api/v1/status",
        "/?token=wrong",
        f"/api/v1/status?token={TOKEN}",
        f"/tree.html?token={TOKEN}",
    ):  # the token opens the page only
        reply = page.get(path)
        assert reply.status_code == 401, path
        assert "URL `evolver ui` printed" in reply.json()["error"]["message"]
    for name, value in (
        (cookie_name(PORT), "wrong"),
        (cookie_name(PORT), TOKEN),  # the token is never a session
        (cookie_name(PORT + 1), TOKEN),
    ):  # another dashboard's cookie (another port)
        page.cookies.clear()
        page.cookies.set(name, value)
        assert page.get("/api/v1/status").status_code == 401, (name, value)


def test_the_token_is_traded_once_for_a_session_of_its_own_and_leaves_the_address(tmp_path):
    traded = []
    app = create_ui_app(str(tmp_path / "no-daemon.sock"), token=TOKEN, port=PORT, on_traded=lambda: traded.append(1))
    page = TestClient(app, base_url=f"http://127.0.0.1:{PORT}", follow_redirects=False)
    reply = page.get(f"/?token={TOKEN}")
    assert reply.status_code == 303 and reply.headers["location"] == "/" and traded == [1]
    cookie = reply.headers["set-cookie"]
    session = page.cookies[cookie_name(PORT)]
    assert cookie.startswith(f"{cookie_name(PORT)}={session};") and session != TOKEN and len(session) >= 40
    assert "HttpOnly" in cookie and "samesite=strict" in cookie.lower()
    assert reply.headers["referrer-policy"] == "no-referrer"
    shown = page.get("/")  # the session cookie answers from now on
    assert shown.status_code == 200 and "<title>evolver</title>" in shown.text
    policy = shown.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "frame-ancestors 'self'" in policy
    assert "http" not in shown.text.replace("http://www.w3.org", "")  # nothing loaded from the network
    again = page.get(f"/?token={TOKEN}")  # the session's holder opens the URL again: the dead token is dropped
    assert again.status_code == 303 and "set-cookie" not in again.headers

    # Whoever finds the URL afterwards (scrollback, browser history) holds a dead token.
    other = TestClient(app, base_url=f"http://127.0.0.1:{PORT}", follow_redirects=False)
    late = other.get(f"/?token={TOKEN}")
    assert late.status_code == 401 and "was used: run `evolver ui` again." in late.json()["error"]["message"]
    assert other.get(f"/api/v1/status?token={TOKEN}").status_code == 401 and traded == [1]


def test_open_hands_the_browser_a_page_only_you_can_read_and_no_token_on_its_command_line(tmp_path):
    from evolver.ui.serve import opener_page

    url = f"http://127.0.0.1:{PORT}/?token={TOKEN}"
    page = opener_page(url, tmp_path)
    assert page.parent == tmp_path and page.stat().st_mode & 0o777 == 0o600
    assert TOKEN not in page.as_uri()  # what the browser's command line gets
    assert f'http-equiv="refresh" content="0; url={url}"' in page.read_text(encoding="utf-8")


def test_a_page_that_rebinds_its_name_to_loopback_is_refused(page):
    """DNS rebinding: evil.example resolving to 127.0.0.1 reaches the port with its own Host header."""
    _authorized(page)
    for host in (f"evil.example:{PORT}", "127.0.0.1", f"127.0.0.1:{PORT + 1}"):
        reply = page.get("/api/v1/status", headers={"host": host})
        assert reply.status_code == 403 and reply.json()["error"]["type"] == "wrong_host", host


def test_a_header_the_guard_reads_comes_once_and_an_origin_must_be_its_own_exactly(page):
    _authorized(page)
    ours = f"127.0.0.1:{PORT}"
    for name, values in (
        ("host", [ours, "evil.example"]),
        ("host", ["evil.example", ours]),
        ("origin", [f"http://{ours}", "http://evil.example"]),
    ):
        reply = page.get("/api/v1/status", headers=[(name, v) for v in values])
        assert reply.status_code == 400, (name, values)
        assert reply.json()["error"] == {
            "type": "duplicate_header",
            "param": None,
            "message": f"the request has two {name.title()} headers; one is allowed",
        }
    body = {"prompt": "What is 6 * 7?"}
    for origin in (
        f"https://{ours}",
        f"http://{ours}:1",
        f"http://127.0.0.1:{PORT + 1}",
        f"ftp://{ours}",
        f"{ours}",
        f"http://evil.example/{ours}",
        "null",
    ):
        reply = page.post("/api/v1/tasks", json=body, headers={"x-evolver-ui": "1", "origin": origin})
        assert reply.status_code == 403 and reply.json()["error"]["type"] == "forbidden", origin
    for origin in (f"http://{ours}", f"http://localhost:{PORT}"):  # its own: passed on (no daemon answers here)
        reply = page.post("/api/v1/tasks", json=body, headers={"x-evolver-ui": "1", "origin": origin})
        assert reply.status_code == 503 and reply.json()["error"]["type"] == "daemon_unreachable", origin


def test_changes_are_taken_only_from_the_page_and_only_those_it_offers(page):
    _authorized(page)
    body = {"prompt": "What is 6 * 7?"}
    refused = page.post("/api/v1/tasks", json=body)  # a form on another site cannot add the header
    assert refused.status_code == 403 and "dashboard's own page" in refused.json()["error"]["message"]
    other_origin = page.post("/api/v1/tasks", json=body, headers={"x-evolver-ui": "1", "origin": "http://evil.example"})
    assert other_origin.status_code == 403
    for path in ("shutdown", "promote", "rollback", "evolve", "tasks/x/feedback", "history/1/revert/extra"):
        reply = page.post(f"/api/v1/{path}", json={}, headers={"x-evolver-ui": "1"})
        assert reply.status_code == 403, path
        assert f"does not pass POST /v1/{path}" in reply.json()["error"]["message"]
    assert page.put("/api/v1/tasks", json=body, headers={"x-evolver-ui": "1"}).status_code == 405


def test_a_daemon_that_is_down_is_named_and_the_page_still_loads(page):
    _authorized(page)
    assert page.get("/").status_code == 200
    for path in ("/api/v1/status", "/api/v1/tasks/task_x/events"):
        reply = page.get(path)
        assert reply.status_code == 503, path
        assert reply.json()["error"]["type"] == "daemon_unreachable"
        assert "start it with `evolver up`" in reply.json()["error"]["message"]
    assert page.get("/tree.html").status_code == 503
    assert page.get("/static/../app.py").status_code in (401, 404)
    assert page.get("/static/nothing.js").status_code == 404


def test_it_listens_on_loopback_only():
    sock = bind_loopback(0)
    try:
        assert sock.getsockname()[0] == "127.0.0.1"
    finally:
        sock.close()


def test_ui_without_a_daemon_says_to_start_one(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("EVOLVER_")}
    env.update({"EVOLVER_DAEMON_DATA_DIR": str(tmp_path / "data"), "EVOLVER_DAEMON_RUNTIME_DIR": str(tmp_path / "run")})
    done = subprocess.run([EVOLVER, "ui"], env=env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 5, done.stderr
    assert "the daemon is not running" in done.stderr and "evolver up" in done.stderr
    assert done.stdout == ""


# --- in a real browser -------------------------------------------------------------------------

CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")


def _browser():
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        webdriver = None
    if webdriver is None or not (CHROMIUM and CHROMEDRIVER):
        missing = "install chromium and chromium-driver (apt) and the test extras (selenium)"
        if os.environ.get("CI"):
            pytest.fail(f"CI runs the dashboard in a real browser: {missing}")
        pytest.skip(f"no headless browser here: {missing}")
    os.environ.setdefault("SE_AVOID_STATS", "true")  # Selenium's own usage statistics: never sent
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--window-size=1400,1900",
        "--no-first-run",
        "--disable-background-networking",
    ):
        options.add_argument(argument)
    return webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))


def _artifacts() -> Path:
    folder = Path(os.environ.get("TEST_ARTIFACTS_DIR") or REPO / "test-artifacts") / "dashboard"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture(scope="module")
def daemon():
    root = make_root()
    slow = {"match": r"\ATask:\nSLOW", "on": "task", **SLOW_STEP}
    # No task held out by chance: the one solved below must be learned from.
    proc = DaemonProcess(
        root,
        model=write_script(root, "script", [slow, *demo_rules()]),
        settings={"EVOLVER_EVOLUTION_HELD_OUT_SHARE": "0"},
    )
    with serving(proc):
        yield proc


@pytest.fixture
def dashboard(daemon):
    """`evolver ui` as a person runs it (one for each test: its token opens it once); yields the URL it
    printed."""
    proc = subprocess.Popen([EVOLVER, "ui"], env=daemon.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = read_line(proc.stdout, timeout_s=60, what="`evolver ui` to print its URL").strip()
        assert url.startswith("http://127.0.0.1:") and "?token=" in url, proc.stderr.read()
        yield url
    finally:
        proc.terminate()
        proc.wait(30)


class Page:
    """Reading and clicking a page that redraws itself: each read is one script (atomic), each click
    finds its element afresh when a redraw replaced it in between."""

    def __init__(self, browser) -> None:
        self.browser = browser

    def text(self, css: str) -> str:
        return self.browser.execute_script(
            "const e = document.querySelector(arguments[0]); return e ? e.textContent : ''", css
        )

    def count(self, css: str) -> int:
        return self.browser.execute_script("return document.querySelectorAll(arguments[0]).length", css)

    def shown(self, css: str) -> bool:
        return bool(
            self.browser.execute_script(
                "const e = document.querySelector(arguments[0]); return !!e && e.checkVisibility()", css
            )
        )

    def click(self, css: str) -> None:
        from selenium.common.exceptions import (
            NoSuchElementException,
            StaleElementReferenceException,
        )
        from selenium.webdriver.common.by import By

        def clicked() -> bool:
            try:
                self.browser.find_element(By.CSS_SELECTOR, css).click()
                return True
            except (StaleElementReferenceException, NoSuchElementException):
                return False

        wait_for(clicked, timeout_s=10, what=f"{css} to click")


def _pack_of(text: str, embedder, where: Path) -> bytes:
    """A pack holding one insight, as another installation would export it."""
    store = Store.open(where, embedder=embedder)
    try:
        store.insights.record_insight_changes("distill", "one insight", [{"op": "ADD", "text": text, "importance": 2}])
        return packs.export_pack(store, insights=True)[0]
    finally:
        store.close()


def test_the_dashboard_in_a_real_browser(daemon, dashboard, embedder, tmp_path):
    from selenium.webdriver.common.by import By

    with daemon.client() as http:
        # Something learned, to be shown and reverted: a solved task, then one distill round.
        solved = http.post(
            "/v1/tasks", json={"prompt": "What is 6 * 7?", "check": {"type": "answer", "expected": "42"}}
        ).json()
        daemon.wait_task(http, solved["id"], ("done",))
        rounds = http.post("/v1/evolve", json={"job": "distill"}).json()["rounds"]
        assert [r["status"] for r in finished_rounds(rounds, lambda p: http.get(p).json())] == ["done"]
        added = [e for e in http.get("/v1/history", params={"kind": "distill"}).json()["events"] if "ADD" in e["what"]]
        assert added, "the demo's distill round adds an insight"
        event_id = added[0]["id"]
        assert http.get("/v1/insights").json()["insights"]

        browser = _browser()
        page = Page(browser)
        shots = _artifacts()
        try:
            browser.get(dashboard)
            assert "token" not in browser.current_url  # traded for the session's cookie
            port, token = int(dashboard.split(":")[2].split("/")[0]), dashboard.split("token=")[1]
            session = browser.get_cookie(cookie_name(port))
            assert session["httpOnly"] and session["value"] != token
            assert httpx.get(dashboard).status_code == 401  # the printed URL opens it no more
            wait_for(lambda: "serving node_" in page.text("#summary"), timeout_s=30, what="the status line")
            revert = f"#history button.revert[data-id='{event_id}']"
            wait_for(lambda: page.count(revert), timeout_s=30, what="the distill event with its revert button")
            assert "Compute arithmetic" in page.text("#insights")
            assert page.count("#curve svg circle"), "the solved task on the curve"
            browser.save_screenshot(str(shots / "loaded.png"))

            # A task submitted on the page: its steps appear while it runs.
            browser.find_element(By.ID, "prompt").send_keys("SLOW walk through the files")
            page.click("#submit-form button")
            wait_for(
                lambda: page.count("#steps li.step") >= 3, timeout_s=60, what="the submitted task's steps in the page"
            )
            followed = page.text("#steps-task")
            assert followed.startswith("task_")
            assert daemon.task(http, followed)["status"] == "running"  # live: seen before it ended
            seen = page.count("#steps li.step")
            wait_for(lambda: page.count("#steps li.step") > seen, timeout_s=30, what="more steps streaming in")
            assert "run_python" in page.text("#steps")
            browser.save_screenshot(str(shots / "live-steps.png"))
            page.click("#cancel-task")
            wait_for(
                lambda: "cancelled" in page.text("#steps-status"),
                timeout_s=60,
                what="the cancelled task's end in the page",
            )
            assert daemon.task(http, followed)["status"] == "cancelled"

            # The tree, in its frame.
            browser.switch_to.frame(browser.find_element(By.ID, "tree"))
            assert page.text("h1") == "Scaffold tree"
            assert page.count(".node.incumbent") == 1
            browser.switch_to.default_content()

            # Revert asks first; "Keep it" changes nothing, "Revert" undoes the insight.
            page.click(revert)
            assert page.shown("#confirm-revert")
            browser.save_screenshot(str(shots / "confirm-revert.png"))
            page.click("#revert-no")
            wait_for(lambda: not page.shown("#confirm-revert"), timeout_s=10, what="the dialog to close")
            time.sleep(0.5)
            assert not http.get("/v1/history", params={"kind": "revert"}).json()["events"]
            assert http.get("/v1/insights").json()["insights"]
            page.click(revert)
            page.click("#revert-yes")
            reverts = wait_for(
                lambda: http.get("/v1/history", params={"kind": "revert"}).json()["events"],
                timeout_s=30,
                what="the revert event",
            )
            assert reverts[0]["reverts"] == event_id and reverts[0]["why"] == "reverted from the dashboard"
            assert not http.get("/v1/insights").json()["insights"]
            wait_for(
                lambda: "reverted" in page.text(f"#history tr[data-id='{event_id}']"),
                timeout_s=30,
                what="the event shown as reverted",
            )
            browser.save_screenshot(str(shots / "reverted.png"))

            # An imported insight waits on probation, saying where it came from, until approved here.
            pack = _pack_of("Name the unit of every number in the answer.", embedder, tmp_path / "source")
            imported = http.post("/v1/import", json={"pack": base64.b64encode(pack).decode()}).json()
            assert imported["probation"] == 1, imported
            (waiting,) = http.get("/v1/insights", params={"status": "probation"}).json()["insights"]
            approve = f"#insights button.approve[data-id='{waiting['id']}']"
            wait_for(lambda: page.count(approve), timeout_s=30, what="the insight on probation with its button")
            assert f"on probation (from pack:{imported['id']}" in page.text("#insights")
            assert not http.get("/v1/insights").json()["insights"]
            page.click(approve)
            wait_for(
                lambda: [i["id"] for i in http.get("/v1/insights").json()["insights"]] == [waiting["id"]],
                timeout_s=30,
                what="the approved insight active",
            )
            wait_for(lambda: not page.count(approve), timeout_s=30, what="the approve button gone")
            assert not [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
        finally:
            browser.quit()


def test_open_keeps_the_token_off_every_command_line_and_removes_its_page_once_traded(daemon, tmp_path):
    # $BROWSER stands for the browser: it records the command line it was given and what it was asked to open.
    seen = tmp_path / "seen"
    browser = tmp_path / "browser"
    browser.write_text(
        f'#!/bin/sh\nprintf \'%s\\n\' "$*" > {seen}.args\ncp "${{1#file://}}" {seen}.page\n', encoding="utf-8"
    )
    browser.chmod(0o700)
    proc = subprocess.Popen(
        [EVOLVER, "ui", "--open"],
        env={**daemon.env, "BROWSER": str(browser)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        printed = read_line(proc.stdout, timeout_s=60, what="`evolver ui` to print its address").strip()
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+/", printed), printed  # no token in the scrollback
        args = (tmp_path / "seen.args").read_text(encoding="utf-8").strip()
        opened = Path(args.removeprefix("file://"))
        assert args.startswith("file:///") and "token" not in args
        assert opened.parent == daemon.runtime_dir and opened.stat().st_mode & 0o777 == 0o600
        url = re.search(r'url=(http://[^"]+)"', (tmp_path / "seen.page").read_text(encoding="utf-8")).group(1)
        assert url.startswith(printed + "?token=")
        with httpx.Client() as http:
            assert http.get(url).status_code == 303  # what the browser does with the page
        wait_for(lambda: not opened.exists(), timeout_s=30, what="the opener page removed once its token was spent")
        assert httpx.get(url).status_code == 401
    finally:
        proc.terminate()
        proc.wait(30)


def test_the_served_page_is_not_readable_from_another_origin(daemon, dashboard):
    """A real fetch from the real server: no CORS header is ever granted, the cookie is the only key."""
    base = dashboard.split("/?")[0]
    port = int(base.rsplit(":", 1)[1])
    token = dashboard.split("token=")[1]
    with httpx.Client(base_url=base) as http:
        assert http.get("/api/v1/status").status_code == 401
        assert http.get(f"/?token={token}").status_code == 303  # traded: the client holds the session
        assert http.cookies[cookie_name(port)] != token
        reply = http.get("/api/v1/status", headers={"origin": "http://evil.example"})
        assert reply.status_code == 200 and "access-control-allow-origin" not in reply.headers
        assert reply.json()["learning"]["windows"]["day"]
    with socket.create_connection(("127.0.0.1", port), timeout=5):
        pass  # it listens where it said
