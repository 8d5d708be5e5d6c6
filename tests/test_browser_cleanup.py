"""Every headless Chromium that tools/check_browser.py and tools/check_layout.py start is ended on every
path (success, failure to start, timeout, retry, KeyboardInterrupt, SIGTERM) with its helpers, and its
``check-browser-*`` profile folder is removed (issue 22, item 5).

Each test compares ``check_browser.leftovers()`` (live Chromium processes, marked launchers and profile
folders) before and after; ``test_the_detector_sees_a_leaked_browser`` plants the leak the old
``close`` made (it ended the launcher script, not the browser under it) and shows the comparison
catches it. Needs a Chromium (``apt-get install chromium-headless-shell``); skipped otherwise.
"""

from __future__ import annotations

import os
import shutil
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

CHROME = check_browser.find_chrome()
pytestmark = pytest.mark.skipif(CHROME is None, reason="no Chromium: apt-get install chromium-headless-shell")

PAGE = "<!doctype html><html><body><p>A page.</p></body></html>"


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


@pytest.fixture
def clean():
    """Fails the test when a browser it started leaves a process or its profile folder behind."""
    first = len(check_browser.STARTED)
    yield
    started = check_browser.STARTED[first:]
    assert started, "the test started no browser"
    new = left_behind(started)
    assert new == {"processes": [], "profiles": []}, f"left behind: {new}"


@pytest.fixture
def site(tmp_path):
    (tmp_path / "p.html").write_text(PAGE)
    return tmp_path


def browser_args(site: Path) -> list[str]:
    return [str(site), "--pages", "p.html", "--widths", "400", "--no-screenshots",
            "--config", str(ROOT / "_config.yml")]


def test_the_detector_sees_a_leaked_browser():
    """The planted failure: end only the launcher (what ``close`` used to do with the Debian
    ``chromium-headless-shell`` script) and keep the profile: the check reports both."""
    first = len(check_browser.STARTED)
    browser = check_browser.Browser(CHROME)
    started = check_browser.STARTED[first:]
    proc, browser.proc = browser.proc, None  # take the process away from close()
    proc.terminate()
    proc.wait()
    try:
        new = left_behind(started, wait=0.5)
        assert any("chromium" in p for p in new["processes"]), new
        assert new["profiles"] == [browser.profile]
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        shutil.rmtree(browser.profile, ignore_errors=True)
    assert left_behind(started) == {"processes": [], "profiles": []}


def test_success(clean, site):
    assert check_browser.main(browser_args(site)) == 0


def test_close_twice_and_context_manager(clean):
    with check_browser.Browser(CHROME) as browser:
        browser.call("Runtime.evaluate", expression="1 + 1")
    browser.close()


def test_a_failure_while_starting(clean, monkeypatch):
    def refuse(*a, **k):
        raise OSError("no DevTools answer (planted)")

    monkeypatch.setattr("urllib.request.urlopen", refuse)
    with pytest.raises(OSError, match="planted"):
        check_browser.Browser(CHROME)


def test_a_chromium_that_exits_at_once(clean, tmp_path):
    fake = tmp_path / "fake-chrome"
    fake.write_text("#!/bin/sh\necho 'no display (planted)' >&2\nexit 3\n")
    fake.chmod(0o755)
    with pytest.raises(RuntimeError, match="planted"):
        check_browser.Browser(str(fake))


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


def test_sigterm_to_the_check(site, tmp_path):
    """``timeout`` or a CI runner ending the check: SIGTERM still closes the browser. The check runs in a
    child process with its own temporary directory and a mark in its environment, which tell its
    browser apart from any other."""
    (site / "p.html").write_text(PAGE.replace("</body>", "<script>while (true) {}</script></body>"))
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    token = f"sigterm-{os.getpid()}-{time.time_ns()}"
    env = {**os.environ, "TMPDIR": str(tmp), "CHECK_BROWSER_TEST": token}
    proc = subprocess.Popen([sys.executable, str(ROOT / "tools" / "check_browser.py"), *browser_args(site)],
                            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    sessions: set[int] = set()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not any("chromium" in p["cmd"] for p in check_browser.processes()
                                                   if p["session"] in sessions):
        sessions |= {p["session"] for p in check_browser.processes() if token.encode() in p["environ"]}
        time.sleep(0.1)
    assert sessions, "the check's browser never started"
    time.sleep(1.0)  # inside the page load now
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) != 0
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline and any(p["session"] in sessions for p in check_browser.processes()):
        time.sleep(0.1)
    assert [p["cmd"] for p in check_browser.processes() if p["session"] in sessions] == []
    assert list(tmp.iterdir()) == [], "a profile folder was left behind"


def test_check_layout_success_and_interrupt(clean, site, monkeypatch):
    assert check_layout.main([str(site), "--pages", "p.html", "--widths", "400"]) == 0

    def stop(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(check_layout, "measure", stop)
    with pytest.raises(KeyboardInterrupt):
        check_layout.main([str(site), "--pages", "p.html", "--widths", "400"])
