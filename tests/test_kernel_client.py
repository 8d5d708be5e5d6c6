"""tools/kernel_client.py: the channel that polls in slices finds a message a poll's wake-up missed
within one slice, returns it, and still raises Empty when the timeout passes with nothing there."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from queue import Empty

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import kernel_client  # noqa: E402


class MissedWakeup:
    """A socket whose message is there from ``ready_at`` on, but whose poll, like a poll that missed
    the edge-triggered wake-up, only notices it when the poll's own timeout runs out."""

    def __init__(self, ready_at: float):
        self.ready_at, self.polls = ready_at, []

    async def poll(self, timeout_ms):
        self.polls.append(timeout_ms)
        await asyncio.sleep(timeout_ms / 1000)
        return int(time.monotonic() >= self.ready_at)


def channel(socket) -> kernel_client.SlicedChannel:
    ch = kernel_client.SlicedChannel.__new__(kernel_client.SlicedChannel)
    ch.socket = socket

    async def recv():
        return {"msg": "reply"}

    ch._recv = recv
    return ch


def test_a_message_a_wakeup_missed_costs_one_slice_not_the_timeout(monkeypatch):
    monkeypatch.setattr(kernel_client, "SLICE_S", 0.05)
    start = time.monotonic()
    socket = MissedWakeup(ready_at=start + 0.12)
    assert asyncio.run(channel(socket).get_msg(timeout=30)) == {"msg": "reply"}
    assert time.monotonic() - start < 1.0                   # not the 30 s timeout
    assert max(socket.polls) <= 50                          # every poll at most one slice


def test_nothing_arrives_raises_empty_at_the_timeout(monkeypatch):
    monkeypatch.setattr(kernel_client, "SLICE_S", 0.05)
    socket = MissedWakeup(ready_at=float("inf"))
    start = time.monotonic()
    with pytest.raises(Empty):
        asyncio.run(channel(socket).get_msg(timeout=0.2))
    assert 0.2 <= time.monotonic() - start < 1.0
    assert len(socket.polls) >= 4


def test_the_manager_hands_out_the_sliced_client():
    km = kernel_client.SlicedKernelManager(kernel_name="python3")
    assert km.client_factory is kernel_client.SlicedKernelClient
    client = km.client()
    assert client.shell_channel_class is kernel_client.SlicedChannel
    assert client.iopub_channel_class is kernel_client.SlicedChannel
