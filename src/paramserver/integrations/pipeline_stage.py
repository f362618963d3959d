"""A stage's process (``pipeline``'s module doc): its module, its links, its commands.

The coordinator spawns it with the address of a control link it bound; the stage
connects there, binds the link its previous stage will connect to (stage 0 has none)
and says it is ready, with that link's address.  Then it does what the coordinator
says, one command at a time, and answers each: wire its next stage in, run a
mini-batch's 1F1B schedule (``pipeline_schedule``), step, zero or hand over its
gradients or parameters, save or load its parameters in its table on the servers, stop.
A failure is answered as ``{"error": ...}``, which the coordinator raises.
"""

from __future__ import annotations

import resource
from collections.abc import Callable
from typing import Any

import cloudpickle
import numpy as np
import torch
from torch import nn

from paramserver.integrations.pipeline_schedule import Abort, Control, one_f_one_b, send_tensor
from paramserver.wire.link import Link, link_transport, release

SLOT_WIDTH = 1024  # floats a row of a stage's table


class Slots:
    """A stage's parameters in its table on the servers: two slots of ``rows`` rows each."""

    def __init__(self, ps: dict[str, Any], module: nn.Module):
        from paramserver.client.client import Client

        self.client = Client(ps["scheduler"])
        self.table, self.rows, self.module = ps["table"], ps["rows"], module

    def keys(self, slot: int) -> np.ndarray:
        return np.arange(slot * self.rows, (slot + 1) * self.rows, dtype=np.uint64)

    def save(self, slot: int) -> None:
        flat = torch.cat([p.detach().reshape(-1) for p in self.module.parameters()]).numpy()
        rows = np.zeros(self.rows * SLOT_WIDTH, np.float32)
        rows[:flat.size] = flat
        self.client.push(self.table, self.keys(slot), rows.reshape(self.rows, SLOT_WIDTH), op="assign").result()

    def load(self, slot: int) -> None:
        flat = torch.from_numpy(self.client.pull(self.table, self.keys(slot)).result().reshape(-1).copy())
        at = 0
        with torch.no_grad():
            for p in self.module.parameters():
                p.copy_(flat[at:at + p.numel()].reshape(p.shape))
                at += p.numel()
                p.grad = None

    def close(self) -> None:
        self.client.close()


def peak_rss_mb() -> float:
    """This process's peak resident memory.  ``VmHWM``, not ``ru_maxrss``: a spawned child's
    ``ru_maxrss`` carries its parent's peak from before its ``exec``."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class _Stage:
    """Stage ``index`` of ``n_stages``: its module and loss, its links, its slots."""

    def __init__(self, index: int, n_stages: int, payload: bytes, control_address: str,
                 ps: dict[str, Any] | None, secret_file: str):
        self.index, self.n_stages = index, n_stages
        self.module: nn.Module
        self.loss_fn: Callable[..., torch.Tensor]
        self.module, self.loss_fn = cloudpickle.loads(payload)
        self.transport = link_transport(secret_file=secret_file)
        self.ctrl = Control(Link.connect(self.transport, control_address))
        self.slots = Slots(ps, self.module) if ps else None
        self.prev: Link | None = None  # activations in, gradients out (bound: the stage before connects)
        self.nxt: Link | None = None  # activations out, gradients in

    def bind_prev(self) -> str:
        if self.prev is not None:
            self.prev.close()
        self.prev = Link.bind(self.transport)
        return self.prev.address

    def serve(self) -> None:
        """Answer commands until told to stop."""
        ops: dict[str, Callable[[dict[str, Any]], dict[str, Any] | None]] = {
            "connect": self.connect, "rebind": lambda cmd: {"address": self.bind_prev()},
            "batch": self.batch, "abort": lambda cmd: {"aborted": True},
            "save": self.save_or_load, "load": self.save_or_load, "grads": self.tensors, "params": self.tensors,
            "sgd": self.sgd, "zero": self.zero, "rss": lambda cmd: {"peak_rss_mb": peak_rss_mb()}}
        while True:
            cmd = self.ctrl.command()
            if cmd["cmd"] == "stop":
                self.ctrl.send({"ok": True})
                return
            answer = ops[cmd["cmd"]](cmd)
            if answer is not None:
                self.ctrl.send(answer)

    def connect(self, cmd: dict[str, Any]) -> dict[str, Any]:
        if self.nxt is not None:
            self.nxt.close()
        self.nxt = Link.connect(self.transport, cmd["next"])
        return {"ok": True}

    def batch(self, cmd: dict[str, Any]) -> dict[str, Any]:
        try:
            return {"loss": one_f_one_b(self.module, self.loss_fn, self.index, self.n_stages, cmd["m"], cmd["g"],
                                        self.ctrl, self.prev, self.nxt)}
        except Abort:
            return {"aborted": True}

    def save_or_load(self, cmd: dict[str, Any]) -> dict[str, Any]:
        assert self.slots is not None
        getattr(self.slots, cmd["cmd"])(cmd["slot"])
        return {"ok": True}

    def tensors(self, cmd: dict[str, Any]) -> None:
        """The count, then each parameter's value or gradient (zeros for none)."""
        op = cmd["cmd"]
        self.ctrl.send({"n": sum(1 for _ in self.module.parameters())})
        for p in self.module.parameters():
            send_tensor(self.ctrl.link, op, 0,
                        p if op == "params" else p.grad if p.grad is not None else torch.zeros_like(p))

    def sgd(self, cmd: dict[str, Any]) -> dict[str, Any]:
        with torch.no_grad():
            for p in self.module.parameters():
                if p.grad is not None:
                    p.add_(p.grad, alpha=-cmd["lr"])
                    p.grad = None
        if self.slots is not None:  # this step's values, into the slot the coordinator commits next
            self.slots.save(cmd["slot"])
        return {"ok": True}

    def zero(self, cmd: dict[str, Any]) -> dict[str, Any]:
        for p in self.module.parameters():
            p.grad = None
        return {"ok": True}

    def close(self) -> None:
        if self.slots is not None:
            self.slots.close()
        release(self.transport, [self.ctrl.link, self.prev, self.nxt])


def stage_main(index: int, n_stages: int, payload: bytes, control_address: str, threads: int,
               ps: dict[str, Any] | None, secret_file: str = "") -> None:
    """A stage's process: its module, its links, its 1F1B schedule for every mini-batch."""
    torch.set_num_threads(threads)
    stage = _Stage(index, n_stages, payload, control_address, ps, secret_file)
    stage.ctrl.send({"ready": index, "address": stage.bind_prev() if index > 0 else ""})
    try:
        stage.serve()
    except Exception as exc:  # said to the coordinator, which raises it
        stage.ctrl.send({"error": f"stage {index}: {type(exc).__name__}: {exc}"})
    finally:
        stage.close()
