"""One stage's 1F1B schedule (``pipeline``'s module doc), and the tensors it exchanges.

A stage runs ``min(K - s - 1, m)`` forwards, then one forward one backward, then the
backwards left.  Its tensors go over ``wire.link`` links: activations to the next stage,
gradients back to the one before, a first stage's inputs and a last stage's targets on
the control link from the coordinator.  A tensor message is a header (``kind``, the
micro-batch ``i``, the attempt's generation ``g``) and one float32 array; a command or an
answer is a header alone.  Tensors of an aborted attempt are dropped wherever they
arrive; an abort read from the control link while the stage waits interrupts it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn

from paramserver.wire.link import Link
from paramserver.wire.message import Message
from paramserver.wire.transport import ZmqPoller


class Abort(Exception):
    """The coordinator aborted the mini-batch in flight (a stage died)."""


class Control:
    """A stage's control link: commands, and a first or last stage's inputs or targets.
    What is read while the stage waits for something else (a tensor sent ahead) is kept
    for later; only an abort interrupts."""

    def __init__(self, link: Link):
        self.link = link
        self.pending: deque[Message] = deque()

    def read_one(self) -> None:
        msg = self.link.recv()
        if not msg.arrays and msg.header.get("cmd") == "abort":
            raise Abort
        self.pending.append(msg)

    def command(self) -> dict[str, Any]:
        """The next command (tensors of an aborted attempt are dropped)."""
        while True:
            msg = self.pending.popleft() if self.pending else self.link.recv()
            if not msg.arrays:
                return msg.header

    def send(self, answer: dict[str, Any]) -> None:
        self.link.send(answer)


def send_tensor(link: Link, kind: str, index: int, tensor: torch.Tensor, generation: int = 0,
                ctrl: Control | None = None) -> None:
    """Send a tensor; with ``ctrl``, a send that cannot go (a dead neighbour) gives way to an
    abort from the coordinator."""
    array = np.ascontiguousarray(tensor.detach().cpu().numpy(), dtype=np.float32)
    header = {"kind": kind, "i": index, "g": generation}
    if ctrl is None:
        link.send(header, [array])
        return
    while not link.try_send(header, [array]):
        if ctrl.link.poll(100):
            ctrl.read_one()


def tensor_of(msg: Message) -> torch.Tensor:
    """A tensor message's tensor (its own, writable copy)."""
    return torch.from_numpy(msg.arrays[0].copy())


def recv_data(link: Link | None, ctrl: Control, generation: int) -> torch.Tensor:
    """The next tensor of this attempt on ``link`` (``None``: the control link, a stage's
    inputs and targets); tensors of an aborted attempt are dropped, an abort raises."""
    poller = ZmqPoller()
    poller.register(ctrl.link.sock)
    if link is not None:
        poller.register(link.sock)
    while True:
        if link is None and ctrl.pending:
            msg = ctrl.pending.popleft()
        elif link is None or ctrl.link.sock in poller.poll(-1):
            ctrl.read_one()  # an abort raises; a tensor is kept
            continue
        else:
            msg = link.recv()
        if len(msg.arrays) == 1 and msg.header.get("g") == generation:
            return tensor_of(msg)


def one_f_one_b(module: nn.Module, loss_fn: Callable[..., torch.Tensor], s: int, k: int, m: int, g: int,
                ctrl: Control, prev: Link | None, nxt: Link | None) -> float:
    """One mini-batch of ``m`` micro-batches on stage ``s`` of ``k``: warm-up forwards,
    then one forward one backward, then the backwards left.  The first stage reads each
    micro-batch's input, the last its target, from the coordinator as it comes to it (the
    rest arrive meanwhile).  Returns the loss (last stage).  Raises ``Abort`` (the
    gradients of the aborted attempt dropped) if the coordinator aborts it."""
    held: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # micro-batch -> (its input, its output or loss)
    total = 0.0

    def forward(i: int) -> None:
        nonlocal total
        x = recv_data(None, ctrl, g) if s == 0 else recv_data(prev, ctrl, g).requires_grad_(True)
        out = module(x)
        if s == k - 1:
            loss = loss_fn(out, recv_data(None, ctrl, g)) / m
            total += float(loss.detach())
            held[i] = (x, loss)
        else:
            assert nxt is not None
            send_tensor(nxt, "act", i, out, g, ctrl)
            held[i] = (x, out)

    def backward(i: int) -> None:
        x, out = held.pop(i)
        if s == k - 1:  # torch.autograd.backward is Tensor.backward, typed
            torch.autograd.backward(out)
        else:
            torch.autograd.backward(out, recv_data(nxt, ctrl, g))
        if s > 0:
            assert prev is not None
            send_tensor(prev, "grad", i, x.grad if x.grad is not None else torch.zeros_like(x), g, ctrl)

    warmup = min(k - s - 1, m)
    try:
        for i in range(warmup):
            forward(i)
        for i in range(warmup, m):
            forward(i)
            backward(i - warmup)
        for i in range(m - warmup, m):
            backward(i)
    except Abort:
        for p in module.parameters():
            p.grad = None
        raise
    return total
