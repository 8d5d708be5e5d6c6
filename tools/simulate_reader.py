"""Run chapters the way a reader on Colab or Binder would: a fresh environment, the project's own
set-up step, then the notebook top to bottom.

    python tools/simulate_reader.py colab --chapters 1          # what CI runs (tests/test_colab.py)
    python tools/simulate_reader.py colab --chapters all        # every chapter (tens of minutes)
    python tools/simulate_reader.py binder --chapters 1,4

**colab**: a fresh virtual environment holding only what Colab preinstalls that matters here
(torch, NumPy, matplotlib, ipywidgets 7, ipykernel, and nbclient to run the notebook); a stand-in
``google.colab`` module on the kernel's path, so the chapter's first cell takes its Colab branch;
that cell's ``git clone`` pointed at a mirror of this checkout's committed HEAD, tagged with the
release tag the cell asks for (so the real clone, pip install and corpus steps run unchanged); then
the chapter executed top to bottom in that environment.

**binder**: a fresh virtual environment with what repo2docker's image brings (ipykernel, nbclient),
then ``binder/postBuild`` run in a clean clone, as repo2docker runs it, then the chapter executed
without any stand-in. torch is preinstalled in both (from the pip cache, or ``PIP_CONSTRAINT``'s
pin in CI) so that the simulation does not download a 2 GB wheel; the install steps still run and
must find it acceptable.

Uncommitted changes are not part of the simulation (it clones HEAD). Exit status 0 when every
chapter ran; the executed notebooks are kept in ``--work`` (default: a temporary folder) on failure.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
# The checkout's own package, found whichever python runs this script (the system python too: the
# simulation makes its own environments, and companion.course, used here, needs only the standard library).
sys.path.insert(1, str(ROOT))
import sync_bootstrap  # noqa: E402

COLAB_PREINSTALLED = ["torch", "numpy", "matplotlib", "ipywidgets==7.7.1", "ipykernel", "nbclient", "nbformat"]
BINDER_PREINSTALLED = ["torch", "ipykernel", "nbclient", "nbformat"]

_RUN = """
import sys, nbformat, nbclient
src, out = sys.argv[1], sys.argv[2]
nb = nbformat.read(src, as_version=4)
nb.cells.append(nbformat.v4.new_code_cell("import sys; print('KERNEL', sys.executable)"))
client = nbclient.NotebookClient(nb, timeout=900, kernel_name="python3",
                                 resources={"metadata": {"path": sys.argv[3]}})
try:
    client.execute()
finally:
    nbformat.write(nb, out)
"""


def run(cmd: list[str], **kw) -> None:
    print("simulate:", " ".join(str(c) for c in cmd), flush=True)
    subprocess.run(cmd, check=True, **kw)


def fresh_env(where: Path, packages: list[str]) -> Path:
    """A new virtual environment at ``where`` with ``packages``; returns its python."""
    venv.EnvBuilder(with_pip=True, clear=True).create(where)
    python = where / "bin" / "python"
    run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *packages])
    return python


def mirror_with_release_tag(work: Path) -> tuple[Path, str]:
    """A bare mirror of this checkout whose release tag (the one the bootstrap cell fetches) is HEAD."""
    mirror = work / "mirror.git"
    run(["git", "clone", "-q", "--bare", str(ROOT), str(mirror)])
    ref = sync_bootstrap.release_ref(ROOT / "pyproject.toml")
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    run(["git", "-C", str(mirror), "tag", "-f", ref, head])
    return mirror, ref


def colab_notebook(chapter: Path, mirror: Path, src: Path) -> dict:
    """The chapter with its bootstrap cell pointed at ``mirror`` and installing into ``src``."""
    nb = json.loads(chapter.read_text())
    cell = sync_bootstrap.first_code_cell(nb)
    text = sync_bootstrap.source_of(cell)
    if text != sync_bootstrap.bootstrap_source(ROOT):
        raise ValueError(f"{chapter.name}: the bootstrap cell is not the template's (run tools/sync_bootstrap.py)")
    repo = sync_bootstrap.repository_url(ROOT / "_config.yml")
    for old, new in ((f'repo = "{repo}"', f'repo = "{mirror}"'), ('"/content/companion-src"', f'"{src}"')):
        if old not in text:
            raise ValueError(f"the bootstrap template no longer contains {old!r}: update {__file__}")
        text = text.replace(old, new)
    cell["source"] = text
    return nb


def _text(output: dict) -> str:
    text = output.get("text", "")
    return "".join(text) if isinstance(text, list) else text


def execute(python: Path, nb: dict, out: Path, cwd: Path, env: dict) -> str:
    """Run ``nb`` with ``python``'s own kernel; return the kernel's sys.executable (checked by the caller)."""
    src = out.with_suffix(".in.ipynb")
    src.write_text(json.dumps(nb))
    run([str(python), "-c", _RUN, str(src), str(out), str(cwd)], env=env)
    last = json.loads(out.read_text())["cells"][-1]
    text = "".join(_text(o) for o in last.get("outputs", []))
    return text.split("KERNEL", 1)[1].strip() if "KERNEL" in text else ""


def kernel_env(extra_path: list[Path]) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTER", "PYTHONPATH", "VIRTUAL_ENV"))}
    env.update(COMPANION_PROFILE="quick", COMPANION_PROGRESS="0", MPLBACKEND="agg")
    if extra_path:
        env["PYTHONPATH"] = os.pathsep.join(str(p) for p in extra_path)
    return env


def simulate_colab(chapters: list[Path], work: Path) -> None:
    python = fresh_env(work / "colab-env", COLAB_PREINSTALLED)
    fake = work / "fake-colab"
    (fake / "google" / "colab").mkdir(parents=True)
    (fake / "google" / "colab" / "__init__.py").write_text('"""Stand-in: only its presence matters."""\n')
    # Colab's kernel has imported google.colab before the first cell runs; sitecustomize does it here
    (fake / "sitecustomize.py").write_text("import google.colab  # noqa: F401\n")
    mirror, _ = mirror_with_release_tag(work)
    env = kernel_env([fake])
    env["PATH"] = f"{python.parent}{os.pathsep}{env['PATH']}"
    for chapter in chapters:
        src = work / f"content-{chapter.stem}" / "companion-src"  # a fresh clone per chapter, as a new session
        nb = colab_notebook(chapter, mirror, src)
        src.parent.mkdir(parents=True)  # Colab's /content
        out = work / f"colab-{chapter.name}"
        kernel = execute(python, nb, out, src.parent, env)
        if not kernel.startswith(str(work)):
            raise RuntimeError(f"{chapter.name} ran in {kernel!r}, not in the simulated environment")
        printed = "".join(_text(o) for o in json.loads(out.read_text())["cells"][
            next(i for i, c in enumerate(nb["cells"]) if c["cell_type"] == "code")].get("outputs", []))
        if "Done: companion" not in printed:
            raise RuntimeError(f"{chapter.name}: the bootstrap cell did not install the companion:\n{printed}")
        print(f"simulate colab: {chapter.name} ran top to bottom", flush=True)


def simulate_binder(chapters: list[Path], work: Path) -> None:
    python = fresh_env(work / "binder-env", BINDER_PREINSTALLED)
    repo = work / "binder-repo"
    run(["git", "clone", "-q", str(ROOT), str(repo)])
    env = kernel_env([])
    env["PATH"] = f"{python.parent}{os.pathsep}{env['PATH']}"
    env["VIRTUAL_ENV"] = str(python.parent.parent)
    run(["bash", "binder/postBuild"], cwd=repo, env=env)
    for chapter in chapters:
        out = work / f"binder-{chapter.name}"
        nb = json.loads((repo / "book" / chapter.name).read_text())
        kernel = execute(python, nb, out, repo / "book", env)
        if not kernel.startswith(str(work)):
            raise RuntimeError(f"{chapter.name} ran in {kernel!r}, not in the simulated environment")
        print(f"simulate binder: {chapter.name} ran top to bottom", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("where", choices=("colab", "binder"), help="which reader's environment to simulate")
    ap.add_argument("--chapters", default="1", help="chapter numbers or ranges (1,3 or 1-3) or 'all' (default: 1)")
    ap.add_argument("--work", type=Path, default=None, help="folder for the environments and the executed notebooks "
                                                             "(default: a temporary folder, removed on success)")
    args = ap.parse_args(argv)
    from companion.course import book_chapters, parse_chapters  # the same chapter syntax as the course command

    try:
        chapters = parse_chapters(args.chapters, book_chapters(ROOT / "book"))
    except ValueError as e:
        ap.error(f"--chapters: {e}")
    work = args.work or Path(tempfile.mkdtemp(prefix=f"simulate-{args.where}-"))
    work.mkdir(parents=True, exist_ok=True)
    (simulate_colab if args.where == "colab" else simulate_binder)(chapters, work)
    if args.work is None:
        shutil.rmtree(work, ignore_errors=True)
    print(f"simulate {args.where}: {len(chapters)} chapter(s) ran top to bottom")
    return 0


if __name__ == "__main__":
    sys.exit(main())
