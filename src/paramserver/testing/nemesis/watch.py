"""A training job's progress, seen from the emulated client host: the job's status asked of the
scheduler every ``EVERY_S``, a line written each time its examples moved on.

    python -m paramserver.testing.nemesis.watch tcp://SCHEDULER:PORT FOLDER

It writes ``FOLDER/progress.jsonl``: ``{"t": monotonic seconds, "ok": true, "examples": N}`` when
the job's examples (done and in progress) grew since the last answer, and ``{"t", "finished":
true, "ok": true}`` once the job is finished; the run's check reads them as the counters' acks
(``check.progress``: progress again within its bound after each heal).  Each look also writes
``{"t", "copying": bool}``: whether the scheduler has vnode copies in flight or unconfirmed (a
failover's repair, a join), which a kill waits out (``Run.settled``).  A question that fails
(the scheduler paused or cut off) is written as ``{"t", "failed": ...}`` and asked again; a client
declared dead meanwhile, or one whose question went unanswered for ``ASK_S``, is replaced.  It
stops when ``FOLDER/stop`` exists or the job finished.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import IO, Any

from paramserver.errors import ClosedError, ParamServerError
from paramserver.testing.nemesis.workload import connect

EVERY_S = 0.25
#: a question unanswered this long is asked again of a new client: a reply lost on the way (a train
#: campaign's seed 203 waited on one for ever once, and the heal before it then looked unanswered by
#: the job); past the heartbeat timeout (5 s), after which the client fails its calls to a silent
#: scheduler itself
ASK_S = 6.0


def examples(status: dict[str, Any]) -> float:
    """The job's examples so far: those of shards done and those of shards in progress."""
    return float(status.get("live", {}).get("examples", 0.0))


def watch(scheduler: str, folder: str) -> None:
    stop = os.path.join(folder, "stop")
    client: Any = None
    seen = 0.0  # examples last written: a line says they grew
    with open(os.path.join(folder, "progress.jsonl"), "a") as log:
        while not os.path.exists(stop):
            try:
                client = client or connect(scheduler)
                status = client.job.status(timeout_s=ASK_S)
                info = client.admin.cluster_info(timeout_s=ASK_S)
            except (ParamServerError, TimeoutError) as e:
                why = f"no answer within {ASK_S:g} s: asked again of a new client" if isinstance(e, TimeoutError) \
                    else f"{type(e).__name__}: {e}"[:300]
                _write(log, {"failed": why})
                if isinstance(e, (ClosedError, TimeoutError)) and client is not None:
                    client.close()
                    client = None
                time.sleep(EVERY_S)  # the next question, at the watch's pace
                continue
            _write(log, {"copying": bool(info.get("migrating") or info.get("incomplete_copies"))})
            now = examples(status)
            if now > seen and status:
                _write(log, {"ok": True, "examples": now})
                seen = now
            if status.get("finished"):
                _write(log, {"ok": True, "finished": True, "examples": now})
                break
            time.sleep(EVERY_S)
    if client is not None:
        client.close()


def _write(log: IO[str], line: dict[str, Any]) -> None:
    log.write(json.dumps({"t": time.monotonic(), **line}) + "\n")
    log.flush()


if __name__ == "__main__":
    import logging

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s watch %(levelname)s %(message)s")
    watch(sys.argv[1], sys.argv[2])
