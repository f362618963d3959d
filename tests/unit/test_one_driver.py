"""One client driver (issue 45.2): the simulated worker drives its calls with the client's
``Scatter`` through ``SimPort``, and has no sending, resending or answering of its own;
both react to a server's ``NODE_LOST`` by asking for the ring."""

import ast
import inspect
from pathlib import Path
from types import SimpleNamespace

import paramserver.testing as testing
from paramserver.client import scatter
from paramserver.client.client import Client
from paramserver.testing import worker
from paramserver.wire.message import Message, Op

DRIVING = {"resend", "answered", "_decide"}  # what a call driver of its own defines (as Scatter does)


def test_the_simulated_worker_drives_its_calls_with_the_clients_scatter() -> None:
    assert worker.Scatter is scatter.Scatter
    assert "Scatter(self.port" in inspect.getsource(worker.SimWorker.scatter_pull)
    assert "Scatter(self.port" in inspect.getsource(worker.SimWorker.send_push)
    # its own pulls and pushes, and its row cache's (the client's CachedCalls, issue 46), go through them
    assert "self.scatter_pull(" in inspect.getsource(worker.SimWorker.pull)
    assert "self.send_push(" in inspect.getsource(worker.SimWorker.push)
    assert "self.cached." in inspect.getsource(worker.SimWorker.pull)
    assert "self.w.scatter_pull(" in inspect.getsource(worker.SimCachePort.scatter_pull)
    assert "self.w.send_push(" in inspect.getsource(worker.SimCachePort.push)


def test_no_class_in_testing_sends_resends_or_answers_a_call() -> None:
    found = []
    for path in Path(testing.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                methods = {f.name for f in node.body if isinstance(f, ast.FunctionDef)}
                if methods & DRIVING:
                    found.append(f"{path.name}:{node.name} {sorted(methods & DRIVING)}")
    assert not found, f"a call driver of the simulation's own: {found} (use client/scatter.Scatter)"


def test_a_client_asks_for_the_ring_when_a_server_is_declared_dead() -> None:
    asked: list[str] = []
    client = object.__new__(Client)  # no cluster: only the reaction is under test
    object.__setattr__(client, "_state", SimpleNamespace(refresh_view=lambda: asked.append("ring"),
                                                       apply_view=lambda view: None))
    object.__setattr__(client, "_losses", SimpleNamespace(record=lambda header: None))
    client._on_notification(Message({"op": Op.NODE_LOST.value, "role": "server", "node_id": 2,
                                     "address": "tcp://127.0.0.1:1"}, []))
    assert asked == ["ring"]
    client._on_notification(Message({"op": Op.NODE_LOST.value, "role": "worker", "node_id": 5}, []))
    assert asked == ["ring"], "a worker's death moves no ring"
