"""Run a command on a named CPU kernel path: the environment that decides which float arithmetic torch does.

    python tools/kernel_path.py pinned -- pytest --nbval book        # the path the stored outputs come from
    python tools/kernel_path.py alternate -- pytest --nbval-lax book # another path: only the asserts count
    python tools/kernel_path.py show                                  # this machine's CPU and torch's capability

Why. torch picks its vectorised kernels (softmax, norms, reductions) by the widest instruction set the CPU
has, and MKL picks its matrix-product code the same way; an AVX-512 machine therefore rounds differently
from an AVX2 one in the last bits, and a training run amplifies those bits into printed digits. Two
variables, read once when torch and MKL load, choose the path instead (CONTRIBUTING.md, "Threads and
determinism", has the measurement that these two are enough):

- ``ATEN_CPU_CAPABILITY``: torch's own kernels (``default`` = no SIMD, ``avx2``, ``avx512``);
- ``MKL_CBWR``: MKL's "conditional bitwise reproducibility" branch (``COMPATIBLE``, ``AVX2``, ...).

Each path also gets its own torch.compile cache folder (``inductor_cache``): Inductor's cache does not
key its compiled C++ by the capability, and a kernel compiled on one path returns wrong numbers on another.

The pinned path is AVX2, which every x86-64 machine of the last decade has, so the committed outputs
reproduce on any of them whatever else they have. The alternate path (no SIMD, MKL's compatible branch)
rounds differently from both AVX2 and AVX-512: a chapter whose asserts hold there as well as on the
pinned path does not depend on the last bits. On other architectures (ARM) the variables are ignored.
"""

from __future__ import annotations

import os
import platform
import sys
import tempfile
from pathlib import Path

PATHS: dict[str, dict[str, str]] = {
    "pinned": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2"},
    "alternate": {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE"},
}


def inductor_cache(name: str) -> str:
    """The torch.compile (Inductor) cache folder of kernel path ``name``.

    Inductor compiles C++ for the capability in force but its cache key does not tell the paths apart:
    measured here, a kernel cached by a native (AVX-512) run and reused under the pinned path returned
    9.578 for a mean whose value is 13.517, and the engine's compiled decode step produced NaN. So each
    path compiles into a folder of its own (the native path keeps torch's default)."""
    user = os.environ.get("USER") or (str(os.getuid()) if hasattr(os, "getuid") else "user")
    return str(Path(tempfile.gettempdir()) / f"torchinductor_{user}_{name}")


def environ(name: str) -> dict[str, str]:
    """The variables of kernel path ``name`` (one of ``PATHS``), with its own Inductor cache folder."""
    if name not in PATHS:
        raise ValueError(f"kernel path must be one of {sorted(PATHS)}; got {name!r}")
    return {**PATHS[name], "TORCHINDUCTOR_CACHE_DIR": inductor_cache(name)}


def cpu_model() -> str:
    """The CPU's model name as /proc/cpuinfo gives it (or what platform knows elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def describe() -> str:
    """One line: CPU model, cores, and the capability torch uses under the current environment."""
    import torch

    pins = ", ".join(f"{k}={os.environ[k]}" for k in ("ATEN_CPU_CAPABILITY", "MKL_CBWR") if k in os.environ)
    return (f"CPU: {cpu_model()} ({os.cpu_count()} cores); torch {torch.__version__} kernel capability "
            f"{torch.backends.cpu.get_cpu_capability()}; pins: {pins or 'none (native path)'}")


def main(argv: list[str]) -> int:
    if argv[:1] == ["show"]:
        print(describe())
        return 0
    if len(argv) < 3 or argv[1] != "--":
        print(__doc__.strip().splitlines()[0], file=sys.stderr)
        print(f"usage: python tools/kernel_path.py {{{'|'.join(PATHS)}}} -- COMMAND [ARGS...] | show", file=sys.stderr)
        return 2
    try:
        os.environ.update(environ(argv[0]))
    except ValueError as err:
        print(f"kernel_path: {err}", file=sys.stderr)
        return 2
    print(f"kernel path '{argv[0]}': " + describe(), flush=True)
    os.execvp(argv[2], argv[2:])
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
