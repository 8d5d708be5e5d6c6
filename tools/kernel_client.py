"""A kernel manager for nbclient whose client never sleeps past a message that has arrived.

Why: pyzmq's asyncio ``socket.poll(timeout)`` can miss a socket's wake-up (its file descriptor is
edge-triggered) and return only when the timeout runs out, with the message long since waiting. With
nbclient that stalls a run for a whole cell timeout while the kernel sits idle: CI's chapter 7 gpu dry
run took 318 s (its cells 15 s, the rest one wait of the 300 s cell timeout between two cells), and a
chapter 2 re-execution waited 899 s of a 900 s timeout between cells 15 and 16, then went on normally.

The fix is the channels' ``get_msg`` polling in slices of at most ``SLICE_S``: each new poll looks at
the socket first, so a missed wake-up costs one slice, not the timeout. It is installed through
jupyter_client's own hooks (the client's ``*_channel_class`` traits and the manager's
``client_factory``) and nbclient's ``kernel_manager_class``, not by patching.
"""

from __future__ import annotations

import time
from queue import Empty

from jupyter_client.asynchronous import AsyncKernelClient
from jupyter_client.channels import AsyncZMQSocketChannel
from jupyter_client.manager import AsyncKernelManager
from traitlets import Type, default

SLICE_S = 1.0


class SlicedChannel(AsyncZMQSocketChannel):
    """``get_msg(timeout)`` as jupyter_client's, waiting in polls of at most ``SLICE_S`` seconds."""

    async def get_msg(self, timeout: float | None = None) -> dict:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = SLICE_S if deadline is None else min(SLICE_S, max(0.0, deadline - time.monotonic()))
            if await self.socket.poll(int(left * 1000)):
                return await self._recv()
            if deadline is not None and time.monotonic() >= deadline:
                raise Empty


class SlicedKernelClient(AsyncKernelClient):
    shell_channel_class = Type(SlicedChannel)
    iopub_channel_class = Type(SlicedChannel)
    stdin_channel_class = Type(SlicedChannel)
    control_channel_class = Type(SlicedChannel)


class SlicedKernelManager(AsyncKernelManager):
    """``AsyncKernelManager`` whose clients are ``SlicedKernelClient``: pass the class as
    ``kernel_manager_class=`` to ``nbclient.NotebookClient`` (which then starts and shuts down the
    kernel as usual)."""

    @default("client_factory")
    def _sliced_client_factory(self) -> type:
        return SlicedKernelClient
