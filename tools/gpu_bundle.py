"""An offline bundle for a GPU machine: the wheels a stock CUDA image lacks, and the derived corpora.

    python tools/gpu_bundle.py gpu_bundle                       # Python 3.12, manylinux x86-64 (the default)
    python tools/gpu_bundle.py gpu_bundle --python-version 3.11 --platform manylinux_2_28_x86_64
    python tools/gpu_bundle.py gpu_bundle --check               # is an existing bundle complete? (no network)

A stock CUDA image (the lent H200's: Python 3.12, torch, triton, numpy, pandas, pyarrow, transformers,
pytest, pytest-xdist, hypothesis) runs the companion's CUDA tests and benchmarks, but not the chapters:
it lacks nbformat, nbclient, jupyter_client, ipykernel, nbval, ipywidgets, matplotlib, datasets (with
dill and multiprocess) and sacrebleu, and such machines often have no network. Run this on a machine
with a package index; it writes, into one folder (``gpu_bundle/`` is ignored by git; benchmarks/gpu_check.sh
looks there, and the device tool can ``carry`` it):

- ``wheels/``: every wheel that the project's run-time needs (``pyproject.toml``'s dependencies, the
  notebook runner, nbval) pull in beyond what the stock image has, for the given Python and platform.
  How: pip resolves the needs for the target as a dry run on package metadata (nothing large is
  downloaded); the bundle is what that brings beyond ``STOCK_NAMES`` (the stock packages and their own
  dependencies), downloaded with ``--no-deps``.
- ``requirements.txt``: those wheels' pinned names (what to install, ``--no-deps``).
- ``corpora.tar.xz``: ``data/derived/`` (built by ``python -m companion.data`` first if missing).
- ``manifest.json``: the target, the stock list, each file's size, and the total.

Install on the GPU machine with no network (benchmarks/gpu_check.sh does this when the folder exists)::

    pip install --no-index --no-deps --find-links gpu_bundle/wheels --target gpu_bundle/site -r gpu_bundle/requirements.txt
    PYTHONPATH=gpu_bundle/site:$PYTHONPATH
    tar -xJf gpu_bundle/corpora.tar.xz      # data/derived/

``--check`` verifies, with no network, that the bundle is complete: every ``Requires-Dist`` of every
bundled wheel (for the target's Python and platform) is met by a bundled wheel or a stock package,
and that pip can install the requirements from the folder alone (``--dry-run --no-index --no-deps``).
The bundle must stay under ``--max-mb`` (50 MB by default); it fails otherwise.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tarfile
import tempfile
import tomllib
import zipfile
from email.parser import HeaderParser
from pathlib import Path

from packaging.markers import Marker, default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

ROOT = Path(__file__).resolve().parents[1]

# What the stock image has (the lent H200's, benchmarks/README.md: torch 2.11, triton 3.6, numpy 2.5,
# transformers 5.17, ...) and what those packages bring with them. The bundle leaves these out: the
# image's copies stay the ones imported.
STOCK = ["torch", "triton", "numpy", "pandas", "pyarrow", "transformers", "pytest", "pytest-xdist", "hypothesis"]
STOCK_DEPENDENCIES = [
    # torch
    "filelock", "typing-extensions", "sympy", "mpmath", "networkx", "jinja2", "markupsafe", "fsspec",
    "setuptools",
    # transformers
    "huggingface-hub", "hf-xet", "tokenizers", "safetensors", "regex", "requests", "urllib3", "certifi",
    "idna", "charset-normalizer", "pyyaml", "packaging", "tqdm",
    # pandas
    "python-dateutil", "pytz", "tzdata", "six",
    # pytest, pytest-xdist, hypothesis
    "pluggy", "iniconfig", "pygments", "execnet", "sortedcontainers", "attrs",
]
STOCK_NAMES = {canonicalize_name(n) for n in STOCK + STOCK_DEPENDENCIES}
# Declared dependencies that nothing here imports unless present: ipykernel's debugger (debugpy, 5 MB)
# and IPython's tab completion (jedi, parso; 5 MB). A batch run of the chapters uses neither, and
# leaving them out keeps the bundle under 50 MB. ``check`` accepts them as absent.
RUNTIME_OPTIONAL = {"debugpy", "jedi", "parso"}
# What running the chapters and tests needs beyond the project's own dependencies.
RUNNER = ["nbval>=0.11", "ipykernel>=6.20", "nbclient", "nbformat", "jupyter_client"]


def needs() -> list[str]:
    """The project's run-time dependencies (pyproject.toml) and the notebook runner, torch left to the image."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return [d for d in project["dependencies"] if canonicalize_name(Requirement(d).name) != "torch"] + RUNNER


def platforms(platform: str) -> list[str]:
    """``platform`` and the older manylinux tags a machine of that glibc also runs (pip does not add them
    for --platform: manylinux_2_28 alone would miss the many wheels tagged manylinux_2_17/manylinux2014)."""
    m = re.fullmatch(r"manylinux_2_(\d+)_(\w+)", platform)
    if m is None:
        return [platform]
    glibc, arch = int(m.group(1)), m.group(2)
    tags = [f"manylinux_2_{k}_{arch}" for k in range(glibc, 4, -1)]
    legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
    return tags + [f"{name}_{arch}" for k, name in legacy.items() if k <= glibc]


def target_args(python_version: str, platform: str) -> list[str]:
    abi = "cp" + python_version.replace(".", "")
    tags = [arg for tag in platforms(platform) for arg in ("--platform", tag)]
    return ["--only-binary=:all:", "--python-version", python_version, *tags,
            "--implementation", "cp", "--abi", abi, "--abi", "abi3", "--abi", "none"]


def resolve(requirements: list[str], python_version: str, platform: str) -> dict[str, str]:
    """{canonical name: version} of what pip would install for ``requirements`` on the target (metadata only)."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--ignore-installed",
               "--report", str(report), "--target", str(Path(tmp) / "t"),
               *target_args(python_version, platform), *requirements]
        subprocess.run(cmd, check=True)
        items = json.loads(report.read_text())["install"]
    return {canonicalize_name(i["metadata"]["name"]): i["metadata"]["version"] for i in items}


def build(out: Path, python_version: str, platform: str, max_mb: float) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    wheels = out / "wheels"
    wheels.mkdir(exist_ok=True)
    resolved = resolve(needs(), python_version, platform)
    extra = {name: version for name, version in resolved.items()
             if name not in STOCK_NAMES and name not in RUNTIME_OPTIONAL}
    pins = [f"{name}=={version}" for name, version in sorted(extra.items())]
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--dest", str(wheels),
                    *target_args(python_version, platform), *pins], check=True)
    (out / "requirements.txt").write_text("\n".join(pins) + "\n")
    derived = ROOT / "data" / "derived"
    if not derived.is_dir() or not any(derived.glob("*.jsonl")):
        subprocess.run([sys.executable, "-m", "companion.data"], check=True, cwd=ROOT)
    with tarfile.open(out / "corpora.tar.xz", "w:xz") as tar:
        tar.add(derived, arcname="data/derived")
    files = {str(p.relative_to(out)): p.stat().st_size for p in sorted(out.rglob("*"))
             if p.is_file() and p.name != "manifest.json"}
    manifest = {"python_version": python_version, "platform": platform, "stock": sorted(STOCK_NAMES),
                "bundled": pins, "files": files,
                "total_mb": round(sum(files.values()) / 2**20, 1)}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def _requires(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        headers = HeaderParser().parsestr(z.read(meta).decode())
    return headers.get_all("Requires-Dist") or []


def check(out: Path, max_mb: float) -> list[str]:
    """Problems with the bundle at ``out`` (empty when it is complete), with no network."""
    manifest = json.loads((out / "manifest.json").read_text())
    env = default_environment()
    major, minor = manifest["python_version"].split(".")[:2]
    env.update(python_version=f"{major}.{minor}", python_full_version=f"{major}.{minor}.0",
               sys_platform="linux", platform_system="Linux", platform_machine="x86_64",
               os_name="posix", platform_python_implementation="CPython", implementation_name="cpython")
    present = STOCK_NAMES | RUNTIME_OPTIONAL
    wheels = sorted((out / "wheels").glob("*.whl"))
    present |= {canonicalize_name(parse_wheel_filename(w.name)[0]) for w in wheels}
    problems = []
    for w in wheels:
        for line in _requires(w):
            req = Requirement(line)
            if req.marker is not None and not req.marker.evaluate({**env, "extra": ""}):
                continue
            if canonicalize_name(req.name) not in present:
                problems.append(f"{w.name} needs {req}, which is neither bundled nor stock")
    with tempfile.TemporaryDirectory() as tmp:
        r = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--no-index", "--no-deps",
                            "--find-links", str(out / "wheels"), "--target", tmp,
                            *target_args(manifest["python_version"], manifest["platform"]),
                            "-r", str(out / "requirements.txt")], capture_output=True, text=True)
    if r.returncode != 0:
        problems.append(f"pip cannot install the requirements from the bundle alone: {r.stderr.strip()[-500:]}")
    total = sum(p.stat().st_size for p in out.rglob("*") if p.is_file()) / 2**20
    if total > max_mb:
        problems.append(f"the bundle is {total:.1f} MB, over --max-mb {max_mb}")
    if not (out / "corpora.tar.xz").is_file():
        problems.append("corpora.tar.xz is missing")
    return problems


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("out", type=Path, help="the bundle folder (gpu_bundle/ is ignored by git)")
    ap.add_argument("--python-version", default="3.12", help="the GPU machine's Python (default 3.12)")
    ap.add_argument("--platform", default="manylinux_2_28_x86_64", help="its wheel platform tag")
    ap.add_argument("--max-mb", type=float, default=50.0, help="size limit of the whole bundle (default 50)")
    ap.add_argument("--check", action="store_true", help="only check an existing bundle, with no network")
    args = ap.parse_args(argv)
    if not args.check:
        manifest = build(args.out, args.python_version, args.platform, args.max_mb)
        print(f"gpu_bundle: {len(manifest['bundled'])} wheels + corpora, {manifest['total_mb']} MB in {args.out}")
    problems = check(args.out, args.max_mb)
    for p in problems:
        print(f"gpu_bundle: {p}", file=sys.stderr)
    if not problems:
        print(f"gpu_bundle: {args.out} is complete for Python {args.python_version} with no network")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
