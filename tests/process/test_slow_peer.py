"""A peer that sends pulls and never reads the replies must not grow the server without
bound (ROUTER high-water marks and the per-peer reply budget, ``wire/transport.py``)."""

import time

import numpy as np
import zmq

from paramserver import LocalCluster
from paramserver.routing.partition import route_pull
from paramserver.wire.message import encode
from paramserver.wire.transport import PEER_REPLY_BYTES_MAX


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def test_unread_pulls_do_not_grow_the_server():
    keys = 200_000  # a 1.6 MB reply each (dim 2); 300 of them held were +580 MB
    with LocalCluster(servers=1, workers=0, log_level="WARNING") as c:
        client = c.client
        client.create_table("t", dim=2)
        client.pull("t", np.arange(10, dtype=np.uint64)).result(timeout=30)
        pid = c.procs["server-0"].popen.pid
        ((_, address),) = client._servers.items()
        ring = client._ring
        routed = route_pull(ring, np.arange(keys, dtype=np.uint64))
        part = routed.parts[0]
        frames = encode({"op": "pull", "table": "t", "ring_version": ring.version},
                        [routed.keys[part.start:part.stop], part.vnodes, part.counts])
        before = _rss_mb(pid)
        ctx = zmq.Context()
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.RCVHWM, 1)  # hostile: reads nothing, keeps nothing on its side
        sock.setsockopt(zmq.RCVBUF, 4096)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(address)
        try:
            for _ in range(300):
                sock.send_multipart(frames)
            peak, last, stable, deadline = before, 0.0, 0, time.monotonic() + 20
            while stable < 4 and time.monotonic() < deadline:  # until the server has handled them
                time.sleep(0.25)
                now = _rss_mb(pid)
                peak = max(peak, now)
                stable = stable + 1 if abs(now - last) < 2 else 0
                last = now
        finally:
            sock.close()
            ctx.term()
        # the replies ZeroMQ may hold for one peer: PEER_REPLY_BYTES_MAX (192 MiB) at once (the old code: +712 MB)
        bound = PEER_REPLY_BYTES_MAX / 2**20 + 80
        assert peak - before < bound, f"server grew by {peak - before:.0f} MB for a peer that does not read"
        # a peer that reads still gets a large reply
        out = client.pull("t", np.arange(keys, dtype=np.uint64)).result(timeout=30)
        assert out.shape == (keys, 2)
