"""Every headless Chromium that tools/check_browser.py and tools/check_layout.py start is ended on every
path (success, failure to start, a renderer that stops answering, retry, an error, KeyboardInterrupt,
and SIGINT, SIGTERM or SIGKILL to the check) with its helpers and its profile folder (issue 22, item 5;
issue 49, item 6: Chromium is launched by Playwright, whose driver ends it when Python goes).

Each test compares ``check_browser.leftovers()`` (the live processes in each Chromium's session, and its
profile folder) before and after, and checks that no Playwright driver is left;
``test_the_detector_sees_a_leaked_browser`` plants a leak (a Browser whose ``close`` is skipped) and
shows the comparison catches it. Needs a Chromium (``apt-get install chromium-headless-shell``) and
Playwright (the ``book`` extra); skipped otherwise.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import check_browser  # noqa: E402
import check_layout  # noqa: E402

pytest.importorskip("playwright")
CHROME = check_browser.find_chrome()
pytestmark = pytest.mark.skipif(CHROME is None, reason="no Chromium: apt-get install chromium-headless-shell")

PAGE = "<!doctype html><html><body><p>A page.</p></body></html>"
# Loads, then its script never yields: the renderer answers no DevTools command any more.
HUNG = "<!doctype html><html><body onload='setTimeout(() => { while (true) {} }, 50)'><p>A page.</p></body></html>"


def left_behind(started: list[dict], wait: float = 3.0) -> dict:
    """What the browsers in ``started`` left: live processes in their sessions, their profile folders
    (waiting up to ``wait`` s for processes to go). Only this test's browsers count, so checks that
    other test workers run at the same time do not."""
    deadline = time.monotonic() + wait
    while True:
        new = check_browser.leftovers(started)
        if not (new["processes"] or new["profiles"]) or time.monotonic() > deadline:
            return new
        time.sleep(0.1)


def in_sessions(sessions: set[int]) -> list[str]:
    """Every live process (any program: Chromium, Playwright's Node driver, Python) in ``sessions``."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if int(stat[3]) in sessions and stat[0] != "Z":
            found.append(f"{pid} {cmd[:100]}")
    return found


def drivers() -> list[str]:
    """Playwright drivers (Node) this process started and that still run."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if ppid == os.getpid() and "playwright" in cmd:
            found.append(f"{pid} {cmd[:100]}")
    return found


@pytest.fixture
def clean():
    """Fails the test when a browser it started leaves a process or its profile folder behind, or
    Playwright's driver runs on with no browser open."""
    first = len(check_browser.STARTED)
    yield
    started = check_browser.STARTED[first:]
    assert started, "the test started no browser"
    new = left_behind(started)
    assert new == {"processes": [], "profiles": []}, f"left behind: {new}"
    assert check_browser.Browser.driver["users"] == 0
    deadline = time.monotonic() + 3
    while drivers() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert drivers() == []


@pytest.fixture
def site(tmp_path):
    (tmp_path / "p.html").write_text(PAGE)
    return tmp_path


def browser_args(site: Path) -> list[str]:
    return [str(site), "--pages", "p.html", "--widths", "400", "--no-screenshots",
            "--config", str(ROOT / "_config.yml")]


def test_the_detector_sees_a_leaked_browser():
    """The planted failure: a Browser whose ``close`` is skipped leaves its Chromium, with its helpers,
    and its profile folder; the check reports both, and finds nothing once it is closed."""
    first = len(check_browser.STARTED)
    browser = check_browser.Browser(CHROME)
    started = check_browser.STARTED[first:]
    try:
        assert started[0]["session"] and started[0]["profile"], started
        new = left_behind(started, wait=0.5)
        assert sum("chromium" in p for p in new["processes"]) >= 2, new  # the browser and its helpers
        assert new["profiles"] == [started[0]["profile"]]
    finally:
        browser.close()
    assert left_behind(started) == {"processes": [], "profiles": []}


def test_success(clean, site):
    assert check_browser.main(browser_args(site)) == 0


def test_close_twice_and_context_manager(clean):
    with check_browser.Browser(CHROME) as browser:
        assert browser.call("Runtime.evaluate", expression="1 + 1")["result"]["value"] == 2
    browser.close()


def test_two_browsers_at_once_share_one_driver(clean):
    """tests/test_layout_check.py keeps a browser open while check_layout.main starts its own."""
    with check_browser.Browser(CHROME) as first:
        with check_browser.Browser(CHROME) as second:
            assert check_browser.Browser.driver["users"] == 2
            assert second.call("Runtime.evaluate", expression="2 + 2")["result"]["value"] == 4
        assert first.call("Runtime.evaluate", expression="1 + 1")["result"]["value"] == 2


def test_a_failure_while_starting(clean, monkeypatch):
    def refuse(self, method, **params):
        raise OSError("no DevTools answer (planted)")

    monkeypatch.setattr(check_browser.Browser, "call", refuse)  # after Chromium is up
    with pytest.raises(OSError, match="planted"):
        check_browser.Browser(CHROME)


def test_a_chromium_that_exits_at_once(clean, tmp_path):
    fake = tmp_path / "fake-chrome"
    fake.write_text("#!/bin/sh\necho 'no display (planted)' >&2\nexit 3\n")
    fake.chmod(0o755)
    with pytest.raises(Exception, match="planted"):
        check_browser.Browser(str(fake))


def test_a_renderer_that_stops_answering_is_a_timeout_retried_once(clean, site, monkeypatch, capsys):
    """Not a hang: each command has ``Browser.timeout``, the page gets a second try in a fresh
    Chromium, and the second silence is reported as the page's problem."""
    (site / "p.html").write_text(HUNG)
    monkeypatch.setattr(check_browser.Browser, "timeout", 3.0)
    start = time.monotonic()
    assert check_browser.main(browser_args(site)) == 1
    out = capsys.readouterr().out
    assert "did not answer within 3 s" in out and "trying the page once more" in out and "no answer again" in out
    assert time.monotonic() - start < 40


def test_timeouts_retry_in_a_fresh_browser_and_end_both(clean, site, monkeypatch, capsys):
    started = []
    real_browser = check_browser.Browser

    def counting(chrome):
        started.append(real_browser(chrome))
        return started[-1]

    def hang(*a, **k):
        raise TimeoutError("Chromium sent nothing for 60 s (planted)")

    monkeypatch.setattr(check_browser, "Browser", counting)
    monkeypatch.setattr(check_browser, "inspect", hang)
    assert check_browser.main(browser_args(site)) == 1
    out = capsys.readouterr().out
    assert "trying the page once more" in out and "no answer again" in out
    assert len(started) == 3  # the first, the retry's, and one to go on with after the page is given up


def test_a_retry_that_succeeds(clean, site, monkeypatch, capsys):
    real_inspect, calls = check_browser.inspect, []

    def once_silent(*a, **k):
        calls.append(1)
        if len(calls) == 1:
            raise TimeoutError("planted")
        return real_inspect(*a, **k)

    monkeypatch.setattr(check_browser, "inspect", once_silent)
    assert check_browser.main(browser_args(site)) == 0
    assert "trying the page once more" in capsys.readouterr().out


@pytest.mark.parametrize("error", [KeyboardInterrupt, RuntimeError])
def test_an_interrupt_or_error_mid_check(clean, site, monkeypatch, error):
    def stop(*a, **k):
        raise error("planted")

    monkeypatch.setattr(check_browser, "inspect", stop)
    with pytest.raises(error):
        check_browser.main(browser_args(site))


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL])
def test_a_signal_to_the_check(site, tmp_path, sig):
    """Ctrl-C, ``timeout`` or a CI runner ending the check, or the kernel killing it: nothing is left.
    The check runs in a session of its own (its Python and Playwright's driver) with its own temporary
    directory (where Chromium's profile goes) and a mark in its environment that finds its Chromium's
    session; the page hangs its renderer, so the check is mid-command when the signal comes."""
    (site / "p.html").write_text(HUNG)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    token = f"signal-{os.getpid()}-{time.time_ns()}"
    env = {**os.environ, "TMPDIR": str(tmp), "CHECK_BROWSER_TEST": token}
    proc = subprocess.Popen([sys.executable, str(ROOT / "tools" / "check_browser.py"), *browser_args(site)],
                            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        sessions = {proc.pid}
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(sessions) < 2:
            sessions |= {p["session"] for p in check_browser.processes()
                         if token.encode() in p["environ"] and "chromium" in p["cmd"]}
            time.sleep(0.1)
        assert len(sessions) == 2, "the check's browser never started"
        assert any("playwright" in p for p in in_sessions({proc.pid})), "no Playwright driver beside the check"
        time.sleep(1.5)  # the page is loaded and its renderer hung now
        assert in_sessions(sessions - {proc.pid}) and list(tmp.iterdir())
        proc.send_signal(sig)
        assert proc.wait(timeout=30) != 0
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and in_sessions(sessions):
            time.sleep(0.1)
        assert in_sessions(sessions) == []
        assert list(tmp.iterdir()) == [], "a profile folder was left behind"
    finally:
        for session in sessions:  # only after a failure is anything left to end
            if in_sessions({session}):
                os.killpg(session, signal.SIGKILL)


def test_check_layout_success_and_interrupt(clean, site, monkeypatch):
    assert check_layout.main([str(site), "--pages", "p.html", "--widths", "400"]) == 0

    def stop(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(check_layout, "measure", stop)
    with pytest.raises(KeyboardInterrupt):
        check_layout.main([str(site), "--pages", "p.html", "--widths", "400"])
