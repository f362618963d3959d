"""The nemesis suite's parts that need no namespaces (issue 47): a seed's schedule replays the
same, a schedule that is not one is refused with the fix, and the checker flags what it must
(lost and doubled adds, hangs, no progress after a heal) and nothing else."""

from __future__ import annotations

import json

import pytest

from paramserver.testing.nemesis import check
from paramserver.testing.nemesis.plan import (
    FENCED_S,
    KILL_SPACING_S,
    KINDS,
    OVERLAPPING,
    REPAIRED_S,
    Fault,
    Plan,
    draw,
    fails,
)
from paramserver.testing.nemesis.workload import N_KEYS, WAIT_S


def test_a_seed_draws_the_same_schedule_and_its_json_replays_it_exactly():
    a, b, c = draw(7), draw(7), draw(8)
    assert a == b and a != c
    assert Plan.from_json(a.to_json()) == a
    assert {f.kind for s in range(40) for f in draw(s).faults} == set(KINDS)  # every kind is drawn


def test_faults_overlap_only_on_distinct_servers_kills_are_spaced_and_quiet_follows_each_group():
    overlaps = 0
    for seed in range(40):
        p = draw(seed, servers=3, window_s=30.0, longest_s=6.0)
        end = 0.0
        for f, g in zip(p.faults, p.faults[1:], strict=False):
            end = max(end, f.at + f.duration)
            if g.at < end:  # g begins while f (or the fault before it) lasts
                overlaps += 1
                assert {f.kind, g.kind} <= set(OVERLAPPING)
                assert f.hosts != g.hosts and 0 not in f.hosts + g.hosts
            else:
                assert g.at >= end + 1.5  # every fault healed, then at least 1.5 s of quiet
        for f in p.faults:
            assert 1.0 <= f.duration <= 15.0
            assert all(0 <= h < p.hosts for h in f.hosts)
            if f.kind in ("isolate", "oneway", "oneway-in", "loss", "slow", "delay", "kill"):
                assert 1 <= f.hosts[0] <= 3  # a server's host: the scheduler is paused, never killed
            if f.kind == "halves":
                assert 0 < len(f.hosts) < p.hosts
    assert overlaps > 10
    for seed in range(60):
        kills = [f.at for f in draw(seed, window_s=60.0).faults if f.kind == "kill"]
        assert all(b - a >= KILL_SPACING_S for a, b in zip(kills, kills[1:], strict=False))  # no double failure
    assert all(a.at + a.duration <= b.at for s in range(40) for a, b in zip(draw(s, overlap=0.0).faults,
                                                                          draw(s, overlap=0.0).faults[1:]))


def test_no_server_fails_after_another_is_written_off_and_before_its_repair():
    """Failures (a kill, or a server silenced long enough to be written off) come within 4 s of
    one another, before the first one's earliest verdict (fenced: the silenced one comes back),
    or 10 s apart, once it is written off and copied again; two kills 20 s apart.  Seed 9025
    drew a 5.7 s one-way cut of server 1's host and a kill of server 2's 5.6 s into it, just
    after server 1 was written off: at replicas 2, 110 keys lost their adds (a double failure)."""
    fenced = repaired = 0
    for seed in range(9000, 9300):
        failures = [f for f in draw(seed).faults if fails(f)]
        for i, a in enumerate(failures):
            for b in failures[i + 1:]:
                gap = b.at - a.at
                if a.kind == b.kind == "kill":
                    assert gap >= KILL_SPACING_S, (seed, a, b)
                else:
                    assert gap <= FENCED_S or gap >= REPAIRED_S, (seed, a, b)
                    fenced += gap <= FENCED_S and "kill" in (a.kind, b.kind)
                    repaired += gap >= REPAIRED_S and "kill" in (a.kind, b.kind)
    assert fenced > 3 and repaired > 3  # a kill and a silence both ways: fenced together, and one after the repair
    assert fails(Fault(1.0, "oneway-in", (1,), 5.69)) and fails(Fault(6.59, "kill", (2,), 3.36))
    assert not fails(Fault(1.0, "oneway-in", (1,), 1.5)) and not fails(Fault(1.0, "pause", (0,), 9.0, 1))
    assert not any(f.kind == "kill" and f.hosts == (2,) and abs(f.at - 6.59) < 0.01 for f in draw(9025).faults)
    asked = ("kill", "pause")  # a kill drawn too soon is another of the kinds asked for (--kinds), no other
    assert all(f.kind in asked for s in range(100) for f in draw(s, kinds=asked).faults)


def test_a_schedule_that_is_not_one_is_refused_with_what_to_replay():
    with pytest.raises(ValueError, match="not a nemesis schedule.*plan"):
        Plan.from_json('{"seed": 1}')
    bad = json.loads(draw(1).to_json())
    bad["faults"][0]["kind"] = "meteor"
    with pytest.raises(ValueError, match="unknown fault kind 'meteor'.*isolate"):
        Plan.from_json(json.dumps(bad))


def _adds(table, oks, unknown=0, wait=0.1, t0=0.0):
    lines = [{"t": t0 + i, "table": table, "ok": True, "wait": wait} for i in range(oks)]
    return lines + [{"t": t0 + oks + i, "table": table, "ok": False, "why": "x", "wait": wait}
                    for i in range(unknown)]


def test_the_counters_pass_when_each_key_holds_the_acknowledged_adds_and_at_most_the_unknown_ones():
    lines = _adds("c2", 10, unknown=2) + _adds("c3", 10)
    values = {"c2": [10.0] * (N_KEYS - 1) + [12.0], "c3": [10.0] * N_KEYS}
    v = check.Verdict()
    check.counters(lines, values, v)
    assert v.ok and v.acked == {"c2": 10, "c3": 10} and v.unknown == {"c2": 2, "c3": 0}


def test_a_lost_acknowledged_add_and_an_add_applied_twice_are_each_named():
    lines = _adds("c2", 10) + _adds("c3", 10, unknown=1)
    values = {"c2": [10.0] * 5 + [9.0] + [10.0] * (N_KEYS - 6), "c3": [10.0] * (N_KEYS - 1) + [12.0]}
    v = check.Verdict()
    check.counters(lines, values, v)
    assert any(x.startswith("lost: 1 key(s) of c2") and "#5 holds 9" in x for x in v.violations)
    assert any(x.startswith("twice: 1 key(s) of c3") and "#511 holds 12" in x for x in v.violations)


def test_an_add_that_waited_its_whole_deadline_is_a_hang():
    v = check.Verdict()
    check.counters(_adds("c2", 3, wait=WAIT_S) + _adds("c3", 3), {"c2": [3.0] * N_KEYS, "c3": [3.0] * N_KEYS}, v)
    assert len(v.violations) == 3 and all(x.startswith("hang: an add to c2") for x in v.violations)


def test_progress_after_each_heal_is_timed_and_no_progress_is_stuck():
    lines = [{"t": t, "table": "c2", "ok": True} for t in (1.0, 2.0, 13.5, 40.0)]
    v = check.Verdict()
    # healed at 2.5: the next add at 13.5 (11 s); at 14: none before the next fault at 16 (too
    # soon to tell); at 20: none within 10 s before the deadline at 35 (stuck)
    check.progress(lines, [2.5, 14.0, 20.0], [15.0, 16.0, 35.0], 10.0, v)
    assert v.recovery_s == [11.0, None, None]
    assert len(v.violations) == 2
    assert v.violations[0].startswith("stuck: no add acknowledged within 10 s of the heal at t=2.5 "
                                      "(first after it: 11.0")
    assert "heal at t=20.0 (first after it: 20.0 s)" in v.violations[1]


def test_a_job_that_trained_all_its_rows_before_a_heal_owes_no_progress_after_it():
    """A heal that came while the job scored its test set and left (its rows all trained, the
    process not yet gone): the run waited 60 s for progress after it and called the job stuck."""
    lines = [{"t": 1.0, "ok": True, "examples": 10}, {"t": 2.0, "ok": True, "finished": True, "examples": 20}]
    assert check.first_progress(lines, 0.5) == 1.0
    assert check.first_progress(lines, 1.5) == 2.0
    assert check.first_progress(lines, 3.0) == 2.0  # finished before the heal at 3.0: nothing is due
    assert check.first_progress(lines[:1], 3.0) is None  # not finished: progress is still due


def test_a_read_that_misses_an_acknowledged_add_is_stale_and_one_past_every_add_is_a_phantom():
    lines = [{"t": 1.0, "table": "c2", "read": [4.0, 4.0], "acked": 4, "unknown": 0},
             {"t": 2.0, "table": "c2", "read": [4.0, 6.0], "acked": 5, "unknown": 1},  # 4 < 5: stale
             {"t": 3.0, "table": "c3", "read": [6.0, 8.0], "acked": 6, "unknown": 1}]  # 8 > 7: phantom
    v = check.Verdict()
    check.reads(lines, v)
    assert v.violations == [
        "stale: 1 read(s) does not see every acknowledged add (first: c2 at t=2.0 read 4..6 after 5 acknowledged "
        "and 1 unknown adds)",
        "phantom: 1 read(s) sees more adds than were made (first: c3 at t=3.0 read 6..8 after 6 acknowledged and "
        "1 unknown adds)"]
    ok = check.Verdict()
    check.reads(lines[:1], ok)
    assert ok.ok


def test_a_training_plan_replays_as_one_and_draws_no_fault_that_cuts_the_jobs_own_host():
    from paramserver.testing.nemesis.plan import TRAINING_KINDS

    p = draw(5, workload="train", kinds=TRAINING_KINDS)
    assert Plan.from_json(p.to_json()) == p and p.workload == "train"
    assert Plan.from_json(json.dumps({"seed": 1, "servers": 3, "faults": []})).workload == "counters"  # old files
    with pytest.raises(ValueError, match="unknown workload 'bake'"):
        Plan.from_json(json.dumps({"seed": 1, "servers": 3, "faults": [], "workload": "bake"}))
    drawn = {f.kind for s in range(40) for f in draw(s, kinds=TRAINING_KINDS, workload="train").faults}
    assert drawn == set(TRAINING_KINDS) and not drawn & {"halves", "isolate-client"}


def _training(rows: int = 1000, logloss: float = 0.4, allowed: float = 1e-5):
    from paramserver.testing.nemesis.jobs import Training, TrainingData

    return Training(TrainingData(("--data", "t.tsv"), "e.tsv", rows, 1, logloss, allowed))


def test_a_training_job_passes_with_every_row_and_the_fault_free_model_within_what_its_consistency_allows():
    v = check.Verdict()
    _training().check({"examples": 1000, "logloss": 0.4 + 9e-6, "failed_workers": []}, v)
    assert v.ok and v.acked == {"examples": 1000} and v.model == {"logloss": 0.4 + 9e-6, "fault_free": 0.4,
                                                                   "allowed": 1e-5}


@pytest.mark.parametrize("report, named", [
    ({"examples": 999, "logloss": 0.4, "failed_workers": []}, "examples: the job trained 999 examples of the 1000"),
    ({"examples": 1500, "logloss": 0.4, "failed_workers": []}, "(a shard lost, or trained twice)"),
    ({"examples": 1000, "logloss": 0.4 + 2e-5, "failed_workers": []}, "its consistency allows 1e-05"),
    ({"examples": 1000, "logloss": float("nan"), "failed_workers": []}, "model: test log loss nan"),
    ({"examples": 1000, "failed_workers": []}, "model: test log loss nan"),
    ({"examples": 1000, "logloss": 0.4, "failed_workers": ["worker-0 died"]}, "workers: ['worker-0 died'] died"),
])
def test_a_training_job_that_lost_or_doubled_rows_or_moved_its_model_is_named(report, named):
    v = check.Verdict()
    _training().check(report, v)
    assert not v.ok and any(named in x for x in v.violations), v.violations


def test_the_watch_counts_the_examples_done_and_in_progress():
    from paramserver.testing.nemesis.watch import examples

    assert examples({"live": {"examples": 1234.0, "loss_sum": 3.0}}) == 1234.0
    assert examples({}) == 0.0


class _Looking:
    """A workload whose log says whether the cluster copies vnodes (as the training job's watch does)."""

    log, looks, ended_at = "progress.jsonl", True, None

    def ended(self, run):
        return False


class _Hosts:
    def address(self, host):
        return "10.0.0.1"


def _run_in(folder, workload):
    from paramserver.testing.nemesis.plan import Fault
    from paramserver.testing.nemesis.run import Run

    return Run(_Hosts(), Plan(0, 1, (Fault(1.0, "kill", (1,), 1.0),)), str(folder), workload)


def _look(folder, copying):
    import time

    with open(folder / "progress.jsonl", "a") as f:
        f.write(json.dumps({"t": time.monotonic(), "copying": copying}) + "\n")


def test_a_kill_waits_for_a_look_taken_since_that_saw_no_copy_in_flight(tmp_path):
    """Issue 47: a kill while a failover's repair still copies is a second failure within the
    first; the run holds it until a fresh look sees the cluster copying nothing."""
    import threading
    import time

    run = _run_in(tmp_path, _Looking())
    _look(tmp_path, False)  # an old look: taken before the kill was due, it does not count
    _look(tmp_path, True)
    later = threading.Timer(0.4, _look, (tmp_path, False))
    later.start()
    t = time.monotonic()
    assert run.settled()
    later.join()
    assert time.monotonic() - t >= 0.35
    assert any("waited" in e for e in run.events), run.events


def test_a_repair_that_never_ends_is_a_stuck_run_and_counters_are_not_held(tmp_path, monkeypatch):
    from paramserver.testing.nemesis import run as run_module
    from paramserver.testing.nemesis.check import Stuck
    from paramserver.testing.nemesis.jobs import Counters

    monkeypatch.setattr(run_module, "SETTLE_S", 0.3)
    run = _run_in(tmp_path, _Looking())
    _look(tmp_path, True)
    with pytest.raises(Stuck, match="still copied vnodes"):
        run.settled()
    (tmp_path / "counters").mkdir()
    counting = _run_in(tmp_path / "counters", Counters())
    assert counting.settled()  # no looks in its log: never waited on
    assert counting.events == []


def test_a_kill_due_after_the_job_trained_its_rows_is_not_struck(tmp_path):
    """The watch stops looking once the job is finished: a kill due then is dropped, as any
    fault due after the job's end, rather than waiting for a look that never comes."""
    import time

    run = _run_in(tmp_path, _Looking())
    _look(tmp_path, True)
    with open(tmp_path / "progress.jsonl", "a") as f:
        f.write(json.dumps({"t": time.monotonic(), "ok": True, "finished": True, "examples": 10.0}) + "\n")
    t = time.monotonic()
    assert not run.settled()
    assert time.monotonic() - t < 1.0 and run.events == []


def test_the_watch_asks_a_new_client_when_a_question_goes_unanswered(tmp_path, monkeypatch):
    """A reply lost on the way left the watch waiting for ever (a train campaign's seed 203): a
    question unanswered for ``ASK_S`` is written as failed and asked again of a new client."""
    from paramserver.testing.nemesis import watch as watch_module

    made, closed = [], []

    class Fake:
        def __init__(self, n):
            self.n = n
            self.job = self.admin = self

        def status(self, timeout_s=None):
            assert timeout_s == watch_module.ASK_S
            if self.n == 0:
                raise TimeoutError
            return {"finished": True, "live": {"examples": 7.0}}

        def cluster_info(self, timeout_s=None):
            return {"migrating": False, "incomplete_copies": 0}

        def close(self):
            closed.append(self.n)

    def connect(scheduler):
        made.append(Fake(len(made)))
        return made[-1]

    monkeypatch.setattr(watch_module, "connect", connect)
    monkeypatch.setattr(watch_module, "EVERY_S", 0.0)
    watch_module.watch("tcp://127.0.0.1:1", str(tmp_path))
    lines = [json.loads(x) for x in (tmp_path / "progress.jsonl").read_text().splitlines()]
    assert "no answer within" in lines[0]["failed"] and closed == [0, 1] and len(made) == 2
    assert lines[-1]["finished"] and lines[-1]["examples"] == 7.0


def test_keep_makes_its_folder_before_any_run_and_names_one_it_cannot(tmp_path):
    """``--keep DIR`` with DIR absent failed after a campaign had made its rows, with a bare
    errno; it is made as ``--log-dir`` is, and a folder that cannot be says so with the fix."""
    import os

    from paramserver.testing.nemesis.campaign import keep_folder

    assert keep_folder(None) is None
    deep = tmp_path / "a" / "b"
    assert keep_folder(str(deep)) is None and deep.is_dir() and os.listdir(deep) == []
    blocker = tmp_path / "file"
    blocker.write_text("x")
    problem = keep_folder(str(blocker / "under"))
    assert problem is not None and str(blocker / "under") in problem and "pick a writable folder" in problem
    problem = keep_folder(str(blocker))
    assert problem is not None and "is a file; name a folder" in problem
