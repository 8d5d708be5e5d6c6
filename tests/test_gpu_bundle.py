"""tools/gpu_bundle.py: the offline bundle's completeness check, on small wheels made here (no network)."""

from __future__ import annotations

import json
import sys
import tarfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import gpu_bundle  # noqa: E402


def _wheel(folder: Path, name: str, version: str, requires: list[str]) -> Path:
    """A minimal pure-Python wheel whose METADATA lists ``requires``."""
    dist = f"{name}-{version}.dist-info"
    path = folder / f"{name}-{version}-py3-none-any.whl"
    meta = "".join([f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"]
                   + [f"Requires-Dist: {r}\n" for r in requires])
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{name}/__init__.py", "")
        z.writestr(f"{dist}/METADATA", meta)
        z.writestr(f"{dist}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{dist}/RECORD", "")
    return path


def _bundle(tmp_path: Path, wheels: list[tuple[str, str, list[str]]]) -> Path:
    out = tmp_path / "bundle"
    (out / "wheels").mkdir(parents=True)
    for name, version, requires in wheels:
        _wheel(out / "wheels", name, version, requires)
    (out / "requirements.txt").write_text("".join(f"{n}=={v}\n" for n, v, _ in wheels))
    with tarfile.open(out / "corpora.tar.xz", "w:xz"):
        pass
    (out / "manifest.json").write_text(json.dumps({"python_version": "3.12", "platform": "manylinux_2_28_x86_64"}))
    return out


def test_a_complete_bundle_passes_with_no_network(tmp_path):
    out = _bundle(tmp_path, [("nbvalx", "1.0", ["kernelx>=1", "numpy", "debugpy", "colorama; sys_platform == 'win32'"]),
                             ("kernelx", "1.2", ["pyzmq-never; python_version < '3.8'"])])
    assert gpu_bundle.check(out, max_mb=50) == []  # numpy: stock; debugpy: optional; markers: not this target


def test_a_dependency_neither_bundled_nor_stock_is_reported(tmp_path):
    # the planted failure: kernelx is required but not in the bundle
    out = _bundle(tmp_path, [("nbvalx", "1.0", ["kernelx>=1"])])
    assert gpu_bundle.check(out, max_mb=50) == ["nbvalx-1.0-py3-none-any.whl needs kernelx>=1, which is neither bundled nor stock"]


def test_the_size_limit_is_enforced(tmp_path):
    out = _bundle(tmp_path, [("nbvalx", "1.0", [])])
    (out / "wheels" / "padding.bin").write_bytes(b"\0" * 2**20)
    assert any("over --max-mb 0.5" in p for p in gpu_bundle.check(out, max_mb=0.5))


def test_older_manylinux_tags_are_added_for_pip():
    tags = gpu_bundle.platforms("manylinux_2_28_x86_64")
    assert tags[0] == "manylinux_2_28_x86_64" and "manylinux_2_17_x86_64" in tags and "manylinux2014_x86_64" in tags
    assert "manylinux_2_29_x86_64" not in tags
    assert gpu_bundle.platforms("win_amd64") == ["win_amd64"]
