"""Execute a notebook in a child process, for tests that run whole chapters outside nbval.

Each execution runs nbclient in its own process (one kernel), not inside the pytest worker: in CI a kernel
twice sat idle while nbclient, running its asyncio loop inside an xdist worker, waited for a message that
never came. A child that exceeds ``total_timeout`` is killed with its kernel and, once, run again; the
caller sees the exit status of the last attempt (None if both timed out) and its stderr.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

TOOLS = Path(__file__).resolve().parents[1] / "tools"  # kernel_client.py

_EXECUTE = """
import sys, nbformat, nbclient
src, out, cwd, timeout, allow, tools = (sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]),
                                        sys.argv[5] == "1", sys.argv[6])
sys.path.insert(0, tools)
from kernel_client import SlicedKernelManager  # polls in slices: a missed wake-up costs a second
nb = nbformat.read(src, as_version=4)
client = nbclient.NotebookClient(nb, kernel_manager_class=SlicedKernelManager, timeout=timeout,
                                 kernel_name="python3", allow_errors=allow, resources={"metadata": {"path": cwd}})
try:
    client.execute()
finally:
    nbformat.write(nb, out)
"""


def execute_notebook(src: Path, out: Path, env: dict, *, cell_timeout: int = 300, total_timeout: int = 420,
                     attempts: int = 2, allow_errors: bool = False) -> tuple[int | None, str]:
    """Run ``src`` top to bottom with the kernel's working directory beside it; write the executed
    notebook to ``out``. Returns (exit status or None after timeouts, stderr of the last attempt).
    With ``allow_errors`` a cell that raises does not stop the run: its error is stored in ``out``."""
    status, err = None, ""
    for _ in range(attempts):
        proc = subprocess.Popen(
            [sys.executable, "-c", _EXECUTE, str(src), str(out), str(src.parent), str(cell_timeout),
             "1" if allow_errors else "0", str(TOOLS)],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True,
        )
        try:
            _, err = proc.communicate(timeout=total_timeout)
            return proc.returncode, err
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the child and the kernel it started
            proc.communicate()
            status, err = None, f"no result after {total_timeout} s"
    return status, err
