"""Input checks an attack campaign found holes in: register's address and metrics (checked
exactly as ZeroMQ takes an address), a table spec missing a field (a protocol answer, not a
traceback), a joining server's wait (another server's death is not the join's failure),
and the dashboard writing what the cluster reports as text, never as HTML."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import zmq

from paramserver.config import load_config
from paramserver.errors import ConfigError, ProtocolError
from paramserver.routing.ring import Ring
from paramserver.scheduler.node import NodeInfo, SchedulerNode
from paramserver.tables.spec import TableSpec
from paramserver.testing.sim import SimNetwork
from paramserver.wire.message import decode, encode
from paramserver.wire.sockets import IPC_PATH_MAX, check_endpoint, check_metrics_url

DASHBOARD = Path(__file__).resolve().parents[2] / "src" / "paramserver" / "dashboard"

GOOD = ["tcp://127.0.0.1:5555", "tcp://localhost:1", "tcp://node-7.cluster.local:65535", "tcp://[::1]:7000",
        "tcp://[fe80::1]:80", "tcp://my_host:9", "ipc:///tmp/ps.sock", "ipc://" + "/" + "a" * (IPC_PATH_MAX - 1),
        "inproc://scheduler"]
BAD = ["tcp://127.0.0.1:5555\n", "tcp://127.0.0.1:5555 ", " tcp://127.0.0.1:5555", "tcp://h\tx:1", "tcp://h:0",
       "tcp://h:65536", "tcp://h:99999", "tcp://h:", "tcp://:5", "tcp://h", "tcp://0.0.0.0:5", "tcp://*:5",
       "tcp://[::]:5", "tcp://[zz::1]:5", "tcp://300.1.1.1:5", "tcp://1.2.3:5", "tcp://-h:5", "tcp://a..b:5",
       "tcp://h:5/x", "tcp://u@h:5", "tcp://h\x00:5", "ipc://", "ipc://*", "ipc:///tmp/a\nb",
       "ipc://" + "/" + "a" * IPC_PATH_MAX, "ipc:///tmp/" + "é" * 60, "inproc://", "udp://h:5", "h:5", "", 5,
       None, "tcp://" + "a" * 300 + ":5"]


@pytest.mark.parametrize("address", GOOD)
def test_an_address_the_check_takes_zmq_takes(address):
    assert check_endpoint(address) == address
    sock = zmq.Context.instance().socket(zmq.DEALER)
    try:
        sock.connect(address)  # the scheduler's check never lets through what a peer's connect refuses
    finally:
        sock.close(linger=0)


@pytest.mark.parametrize("address", BAD)
def test_a_bad_address_is_a_protocol_error_naming_it(address):
    with pytest.raises(ProtocolError, match="address"):
        check_endpoint(address)


@pytest.mark.parametrize("address", ["tcp://127.0.0.1:5555\n", "ipc:///" + "a" * IPC_PATH_MAX])
def test_the_holes_found_are_ones_zmq_refuses(address):
    sock = zmq.Context.instance().socket(zmq.DEALER)
    try:
        with pytest.raises(zmq.ZMQError):
            sock.connect(address)
    finally:
        sock.close(linger=0)


@pytest.mark.parametrize("url", ["", None, "http://127.0.0.1:9100/metrics", "https://node-1:443/x/metrics?a=b",
                                 "http://0.0.0.0:8000/metrics", "http://[::1]:80/"])
def test_a_metrics_url_is_empty_or_http_host_port(url):
    assert check_metrics_url(url) == (url or "")


@pytest.mark.parametrize("url", ["javascript:alert(1)", "http://h:80/\n", "http://h:80/<img src=x>", "ftp://h:1/",
                                 "http://h/metrics", "http://h:0/", "http://h:70000/", "http://u@h:80/",
                                 "http://" + "a" * 600 + ":80/", 7, ["http://h:1/"], "http://h:80/a b"])
def test_a_bad_metrics_url_is_a_protocol_error(url):
    with pytest.raises(ProtocolError, match="metrics URL"):
        check_metrics_url(url)


@pytest.fixture
def scheduler():
    """A scheduler on real ZeroMQ (its address check is zmq's), replies recorded."""
    made = []

    def make(servers=(), transport=None):
        s = SchedulerNode(load_config(host="127.0.0.1", port=0, servers=max(1, len(servers))), transport=transport)
        s.sent = []
        made.append(s.sock)
        s.sock = _Recorder(s.sent)
        s._notify = lambda node, header: None
        for i in servers:
            s.nodes[i] = NodeInfo(i, "server", b"s%d" % i, f"sim://server-{i}", s.clock())
            s.by_identity[b"s%d" % i] = i
        if servers:
            s.registry.next_id = max(servers) + 1
            s.ring = Ring.create(list(servers), 4)
        return s

    yield make
    for sock in made:
        sock.close(linger=0)


class _Recorder:
    """A scheduler's socket that records what it would send, decoded."""

    def __init__(self, sent):
        self.sent = sent

    def send(self, frames, identity=None):
        self.sent.append((identity, decode(frames).header))


def _ask(s, identity, **header):
    """The scheduler's answer to one request, as it would send it."""
    s.sent.clear()
    s._handle([identity, *encode({"id": 9, **header})])
    answers = [h for who, h in s.sent if who == identity]
    return answers[-1] if answers else None


@pytest.mark.parametrize("address", ["tcp://127.0.0.1:5555\n", "ipc:///" + "a" * 120,
                                     "ipc:///tmp/<img src=x onerror=alert(1)>\t", "tcp://0.0.0.0:5"])
def test_register_refuses_an_address_zmq_would_refuse(scheduler, address):
    s = scheduler()
    answer = _ask(s, b"fake", op="register", role="server", address=address)
    assert answer["op"] == "error" and answer["code"] == "protocol" and "address" in answer["error"]
    assert not s.nodes


def test_register_checks_every_roles_address_and_metrics(scheduler):
    s = scheduler()
    answer = _ask(s, b"w", op="register", role="worker", address="tcp://h:1\n")
    assert answer["code"] == "protocol" and "address" in answer["error"]
    answer = _ask(s, b"w", op="register", role="worker", metrics="http://h:1/<script>\n")
    assert answer["code"] == "protocol" and "metrics URL" in answer["error"]
    answer = _ask(s, b"s", op="register", role="server", address="tcp://127.0.0.1:5555", metrics=["x"])
    assert answer["code"] == "protocol" and "metrics URL" in answer["error"]
    answer = _ask(s, b"s", op="register", role="server", address="tcp://127.0.0.1:5555", pid="12")
    assert answer["code"] == "protocol" and "pid" in answer["error"]
    assert not s.nodes
    answer = _ask(s, b"s", op="register", role="server", address="tcp://127.0.0.1:5555",
                  metrics="http://127.0.0.1:9100/metrics", pid=1234)
    assert answer["op"] == "ok"
    (node,) = s.nodes.values()
    assert (node.address, node.metrics, node.pid) == ("tcp://127.0.0.1:5555", "http://127.0.0.1:9100/metrics", 1234)


@pytest.mark.parametrize("spec, field", [
    ({"dim": 4}, "name"), ({}, "name"), ({"name": 3}, "name"), ({"name": "t", "dim": "4"}, "dim"),
    ({"name": "t", "dim": True}, "dim"), ({"name": "t", "seed": 1.5}, "seed"), ({"name": "t", "seed": None}, "seed"),
    ({"name": "t", "optimizer": 3}, "optimizer"), ({"name": "t", "optimizer": None}, "optimizer"),
    ({"name": "t", "initializer": [1]}, "initializer"), ({"name": "t", "consistency": [0]}, "consistency"),
    ({"name": "t", "consistency": True}, "consistency"), ({"name": "t", "consistency": float("nan")}, "staleness"),
    ({"name": "t", "aggregate": "yes"}, "aggregate"), ({"name": "t", "aggregate": None}, "aggregate"),
    ({"name": "t", "replicas": "2"}, "replicas"), ({"name": "t", "key_bits": 1.0}, "key_bits"),
    ({"name": "t", "block_size": None}, "block_size"), ({"name": "t", 1: 2}, "unknown"),
    ({"name": "t", "bogus": 1}, "unknown"), ("t", "map"), (None, "map")])
def test_a_malformed_table_spec_is_a_config_error_naming_the_field(spec, field):
    with pytest.raises(ConfigError, match=field):
        TableSpec.from_wire(spec)


def test_from_wire_still_takes_what_to_wire_gives():
    spec = TableSpec("m/w", dim=8, optimizer={"name": "ftrl", "alpha": 0.1}, consistency="ssp:2", replicas=1,
                     key_bits=10, block_size=64, seed=3)
    assert TableSpec.from_wire(spec.to_wire()) == spec
    assert TableSpec.from_wire(json.loads(json.dumps(TableSpec("t").to_wire()))) == TableSpec("t")


def test_create_table_without_a_name_is_answered_with_the_reason_not_internal(scheduler):
    s = scheduler([1, 2], transport=SimNetwork(0).host("scheduler").transport())
    answer = _ask(s, b"driver", op="create_table", spec={"dim": 4})
    assert answer["op"] == "error" and answer["code"] in ("config", "protocol"), answer
    assert "name" in answer["error"] and "Traceback" not in answer["error"]


def _finish_migrations(s):
    for _ in range(20):
        if s.migration is None:
            return
        for source in sorted(s.migration.waiting):
            s.on_migrated(b"s%d" % source, decode(encode({"op": "migrated", "id": 0, "migration": s.migration.id,
                                                          "node_id": source})))
    raise AssertionError("the migrations never ended")


def test_a_join_that_completes_is_a_success_although_another_server_died(scheduler):
    s = scheduler([1, 2, 3], transport=SimNetwork(0).host("scheduler").transport())
    s.tables["t"] = TableSpec("t", 1)
    assert _ask(s, b"new", op="register", role="server", address="sim://new", pid=4242)["op"] == "ok"
    joiner = s.by_identity[b"new"]
    s.sent.clear()
    s._handle([b"launcher", *encode({"op": "wait_servers", "id": 7, "joiner": {"pid": 4242}})])
    s._handle([b"counter", *encode({"op": "wait_servers", "id": 8, "count": 4})])  # the old way: a count
    assert not s.sent and s.migration is not None  # the join's copies are under way
    s._remove(2, "dead")  # another server dies mid-join
    counted = [h for who, h in s.sent if who == b"counter"]
    assert counted and counted[0]["code"] == "node_lost"  # a count of 4 is no longer coming ...
    assert not [h for who, h in s.sent if who == b"launcher"]  # ... but the join goes on
    _finish_migrations(s)
    assert s.membership.settled and joiner in s.ring.servers
    (answer,) = [h for who, h in s.sent if who == b"launcher"]
    assert answer["op"] == "ok" and joiner in answer["servers"]


def test_a_join_fails_when_the_joiner_itself_dies(scheduler):
    s = scheduler([1, 2], transport=SimNetwork(0).host("scheduler").transport())
    s.tables["t"] = TableSpec("t", 1)
    _ask(s, b"new", op="register", role="server", address="sim://new", pid=4242)
    s.sent.clear()
    s._handle([b"launcher", *encode({"op": "wait_servers", "id": 7, "joiner": {"pid": 4242}})])
    s._handle([b"other", *encode({"op": "wait_servers", "id": 8, "joiner": {"address": "sim://not-started"}})])
    s._remove(s.by_identity[b"new"], "dead")
    (answer,) = [h for who, h in s.sent if who == b"launcher"]
    assert answer["code"] == "node_lost" and "joining server" in answer["error"]
    assert not [h for who, h in s.sent if who == b"other"]  # another joiner's wait goes on
    answer = _ask(s, b"bad", op="wait_servers", joiner={"pid": "x"})
    assert answer["code"] == "protocol" and "joiner" in answer["error"]


# ---- the dashboard: what the cluster reports is text, never HTML ------------------------------

def test_the_dashboard_never_parses_what_it_shows_as_html():
    js = (DASHBOARD / "app.js").read_text()
    page = (DASHBOARD / "index.html").read_text()
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function",
                 "srcdoc", "createContextualFragment", "DOMParser"):
        assert sink not in js, f"app.js uses {sink}: build nodes with el()/html() and set text"
    assert not re.search(r"<script(?![^>]*\bsrc=)", page), "index.html has an inline script"
    assert not re.search(r"\son\w+\s*=", page), "index.html has an inline event handler"


HOSTILE = "ipc:///tmp/<img src=x onerror=alert(1)>"

# A DOM just big enough for app.js: any markup it parsed would land in innerHTML (refused)
FAKE_DOM = r"""
class Node {
  constructor(tag) { this.tag = tag; this.children = []; this.attrs = {}; this.dataset = {}; this.style = {};
    this._text = ""; this.className = ""; }
  appendChild(c) { this.children.push(c); return c; }
  append(...cs) { for (const c of cs) this.children.push(typeof c === "string" ? new Text(c) : c); }
  removeChild(c) { this.children.splice(this.children.indexOf(c), 1); }
  get firstChild() { return this.children[0] || null; }
  setAttribute(k, v) { this.attrs[k] = String(v); }
  set textContent(t) { this.children = []; this._text = String(t); }
  get textContent() { return this._text + this.children.map(c => c.textContent).join(""); }
  set innerHTML(h) { throw new Error("innerHTML set: " + h); }
  set outerHTML(h) { throw new Error("outerHTML set: " + h); }
  insertAdjacentHTML() { throw new Error("insertAdjacentHTML"); }
}
class Text extends Node { constructor(t) { super("#text"); this._text = t; } }
globalThis.Node = Node;
const byId = {};
globalThis.document = {
  createElement: t => new Node(t), createElementNS: (ns, t) => new Node(t),
  getElementById: id => (byId[id] = byId[id] || new Node(id)),
  querySelector: sel => (byId[sel] = byId[sel] || new Node(sel)),
  body: new Node("body"), write() { throw new Error("document.write"); },
};
globalThis.location = {search: ""};
globalThis.URLSearchParams = URLSearchParams;
globalThis.setTimeout = () => 0;
"""


def test_the_dashboard_shows_a_hostile_address_as_text():
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed: the static check above still holds")
    state = {"state": "running", "servers": [{"id": 1, "address": HOSTILE, "keys": 3, "rss_bytes": 1 << 20,
                                              "keys_per_s": 2, "vnodes": 4, "hot": True}],
             "workers": [{"id": 5, "rank": 0, "examples": 10, "examples_per_s": 1, "shards_done": 1,
                          "straggler": True, "alive": True}],
             "ring": {"servers": [1], "owners": [1, 1], "vnodes": {"1": 2}, "version": 3},
             "history": [{"at": 1, "examples_per_s": 1}], "staleness": [{"label": "<b>0</b>", "count": 1}],
             "events": [{"at": 1, "what": HOSTILE + " joined"}], "job": {}, "totals": {}, "at": 1}
    script = (FAKE_DOM + (DASHBOARD / "app.js").read_text().replace("poll();", "") + f"""
const s = {json.dumps(state)};
drawThroughput(s.history); drawServers(s.servers, s.ring); drawRing(s.ring); drawStaleness(s.staleness);
drawWorkers(s.workers, s.job); drawEvents(s.events, s.job);
const text = n => n.textContent;
console.log(JSON.stringify({{servers: text(document.querySelector("#server-table tbody")),
  workers: text(document.querySelector("#workers tbody")), events: text(document.getElementById("events")),
  legend: text(document.getElementById("ring-legend"))}}));
""")
    out = subprocess.run([node, "-e", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    shown = json.loads(out.stdout.strip().splitlines()[-1])
    assert HOSTILE in shown["servers"] and HOSTILE in shown["events"]
    assert "straggler" in shown["workers"] and "server 1: 2 vnodes" in shown["legend"]
