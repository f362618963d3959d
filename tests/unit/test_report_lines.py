"""The train report's lines that summarise: what ran, and the staleness pulls saw."""

from paramserver.cli.train_report import run_lines, staleness_line


def test_staleness_is_one_short_line():
    assert staleness_line({"0": 90, "1": 5, "3": 5}) == "90% at 0, 95% ≤ 1, max 3 (100 pulls)"
    assert staleness_line({}) == "-"
    assert len(staleness_line({str(k): 10**6 for k in range(40)})) < 45  # no wrap in an 80-column table


def test_the_report_names_what_ran():
    lines = dict(run_lines({"model": "fm", "table_dim": 9, "format": "criteo", "hash_bits": 24,
                             "data": ["a.tsv", "b.tsv", "c.tsv", "d.tsv"]}))
    assert lines["model"] == "fm (a key's row: 9 values), criteo rows, 24 hash bits"
    assert lines["data"] == "a.tsv, b.tsv, c.tsv and 1 more"
    assert dict(run_lines({"model": "lr", "table_dim": 1, "format": "libsvm", "hash_bits": 0,
                            "data": ["x"]}))["model"].endswith("no folding")
    assert run_lines({}) == []


def test_a_training_job_says_the_batches_a_worker_kept_in_flight_and_what_link_measured():
    ran = {"model": "lr", "table_dim": 1, "format": "criteo", "hash_bits": 24, "data": ["x"]}
    far = dict(run_lines({**ran, "pipeline_depth": 12, "round_trip_floor_ms": 10.237}))
    assert far["batches in flight a worker"] == "12 (the link's round trip, timed by pings: 10.24 ms)"
    assert dict(run_lines({**ran, "pipeline_depth": 3, "round_trip_floor_ms": None}))[
        "batches in flight a worker"] == "3"
    assert "batches in flight a worker" not in dict(run_lines(ran))  # predict, eval: no pipeline
    stepped = dict(run_lines({**ran, "pipeline_depth": 4, "round_trip_floor_ms": 0.21, "steps": True}))
    assert stepped["batches in flight a worker"] == "4 as steps (the link's round trip, timed by pings: 0.21 ms)"
