"""Metrics and the dashboard of a running cluster: /metrics counts exactly what clients
sent, every node serves its own with --metrics-port, and the dashboard, loaded in a real
headless Chromium, shows the numbers the cluster reports."""

import json
import os
import shutil
import threading
import urllib.request

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from paramserver import LocalCluster
from paramserver.apps.ctr.models import Model
from paramserver.apps.ctr.synth import write_synth
from paramserver.apps.ctr.train import TrainConfig
from paramserver.apps.ctr.train_loop import train_worker
from paramserver.data.reader import make_shards

CHROMIUM = "/usr/bin/chromium"


def scrape(url: str) -> dict[tuple[str, tuple], float]:
    text = urllib.request.urlopen(url, timeout=30).read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def get(samples, name, **labels):
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def test_the_clusters_metrics_count_exactly_what_clients_sent():
    with LocalCluster(servers=2, workers=1, http_port=0, log_level="WARNING") as cluster:
        client = cluster.client
        assert cluster.http_url.startswith("http://127.0.0.1:")
        client.create_table("emb", dim=4)
        client.create_table("bias", dim=1)
        url = cluster.http_url + "metrics"
        before = scrape(url)
        rng = np.random.default_rng(0)
        pushed = pulled = 0
        for n in (1000, 37, 4096):
            keys = rng.choice(1 << 40, n, replace=False).astype(np.uint64)
            client.push("emb", keys, np.ones((n, 4), np.float32)).result(timeout=30)
            client.pull("emb", keys[: n // 2]).result(timeout=30)
            pushed, pulled = pushed + n, pulled + n // 2
        client.push("bias", np.arange(10, dtype=np.uint64), np.ones((10, 1), np.float32)).result(timeout=30)
        after = scrape(url)  # a scrape right after the replies: the servers counted before answering
        assert get(after, "paramserver_push_keys_total", table="emb") - get(before, "paramserver_push_keys_total",
                                                                           table="emb") == pushed
        assert get(after, "paramserver_pull_keys_total", table="emb") == pulled
        assert get(after, "paramserver_push_keys_total", table="bias") == 10
        # each call went to both servers: two requests a call, summed over the servers
        assert get(after, "paramserver_push_requests_total", table="emb") == 6
        assert get(after, "paramserver_pull_requests_total", table="emb") == 6
        assert get(after, "paramserver_request_seconds_count", op="push") == 8
        assert get(after, "paramserver_request_bytes_total", table="emb", op="push") > pushed * 4 * 4
        stats = client.stats.server_stats()
        for s in stats:  # gauges per server, as the servers report them
            assert get(after, "paramserver_table_keys", table="emb", server=str(s["node_id"])) == \
                s["tables"]["emb"]["keys"]
        assert sum(s["tables"]["emb"]["keys"] for s in stats) == pushed
        assert get(after, "paramserver_servers") == 2 and get(after, "paramserver_workers") == 1
        info = client.admin.cluster_info()
        assert info["http"] == cluster.http_url
        state = json.loads(urllib.request.urlopen(cluster.http_url + "api/state", timeout=30).read())
        assert state["state"] == "running" and sum(s["keys"] for s in state["servers"]) == pushed + 10
        with pytest.raises(urllib.error.HTTPError, match="404"):
            urllib.request.urlopen(cluster.http_url + "nope", timeout=30)


def test_every_node_serves_its_own_metrics_with_metrics_port(monkeypatch):
    monkeypatch.setenv("PARAMSERVER_METRICS_PORT", "0")  # every node: any free port
    with LocalCluster(servers=2, workers=1, log_level="WARNING") as cluster:
        client = cluster.client
        client.create_table("t", dim=1)
        assert cluster.run(_push_and_report, timeout_s=60) == [3]
        urls = client.admin.cluster_info()["metrics"]
        servers = [str(s) for s in client.admin.cluster_info()["ring_servers"]]
        workers = list(client.admin.cluster_info()["workers"])
        assert set(servers) <= set(urls) and len(workers) == 1
        worker = scrape(urls[workers[0]])
        assert get(worker, "paramserver_client_calls_total", op="push") == 1
        assert get(worker, "paramserver_worker_examples_total") == 100
        assert get(worker, "paramserver_client_sent_bytes_total") > 100 * 12
        own = [get(scrape(urls[s]), "paramserver_push_keys_total", table="t") for s in servers]
        assert sum(own) == 100 and all(0 < n < 100 for n in own)  # each its share
        assert get(scrape(urls["scheduler"]), "paramserver_push_keys_total", table="t") == 100  # the cluster's


def _push_and_report(client):
    client.push("t", np.arange(100, dtype=np.uint64), np.ones((100, 1), np.float32)).result(timeout=30)
    client.job.report_progress(examples=100)
    return 3


def test_the_dashboard_in_chromium_shows_what_the_cluster_reports(tmp_path):
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing: make test installs Debian's chromium (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    data = str(tmp_path / "d.tsv")
    write_synth(data, 30_000, seed=4)
    cfg = TrainConfig(Model("lr"), batch_size=200)
    shot = tmp_path / "dashboard.png"
    with LocalCluster(servers=2, workers=2, http_port=0, log_level="WARNING") as cluster, sync_playwright() as pw:
        client = cluster.client
        client.admin.create_table_spec(cfg.table_spec())
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
            "--disable-component-update", "--disable-sync"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 1100})
            page.goto(cluster.http_url)
            page.wait_for_selector("tr.server", timeout=30_000)  # the page polls and draws the servers
            client.job.start(make_shards([data], 200_000), 1)
            scrapes: list = []  # /api/state and /metrics while the job runs: always answered
            done = threading.Event()

            def scrape_while_training():
                while True:  # once at least, then until the job is over
                    state = json.loads(urllib.request.urlopen(cluster.http_url + "api/state", timeout=30).read())
                    scrapes.append((state["job"], scrape(cluster.http_url + "metrics")))
                    if done.is_set():
                        return

            scraper = threading.Thread(target=scrape_while_training)
            scraper.start()
            try:
                results, failed = cluster.run_elastic(train_worker, cfg)
            finally:
                done.set()
                scraper.join(60)
            assert scrapes and not scraper.is_alive()
            for job, samples in scrapes:
                assert job["shards_queued"] == job["shards"] - job["shards_done"] - job["running"] >= 0
                assert 0 <= get(samples, "paramserver_shards_queued") <= job["shards"]  # a scrape a moment later
            assert not failed and sum(r["examples"] for r in results) == 30_000
            status = client.job.status()
            per_worker = {k: int(v["examples"]) for k, v in status["per_worker"].items()}
            assert sum(per_worker.values()) == 30_000
            # the page catches up with the finished job (it polls every second)
            page.wait_for_function(
                "want => [...document.querySelectorAll('tr.worker')].map(r => r.dataset.id + ':' + "
                "Math.round(r.dataset.examples)).sort().join(',') === want",
                arg=",".join(sorted(f"{k}:{v}" for k, v in per_worker.items())), timeout=30_000)
            stats = {str(s["node_id"]): s for s in client.stats.server_stats()}
            page.wait_for_function(  # keys settle once the last pushes are in
                "want => [...document.querySelectorAll('tr.server')].map(r => r.dataset.id + ':' + r.dataset.keys)"
                ".sort().join(',') === want",
                arg=",".join(sorted(f"{k}:{sum(t['keys'] for t in s['tables'].values())}" for k, s in stats.items())),
                timeout=30_000)
            ring = client.admin.ring
            shown = {e.get_attribute("data-server"): int(e.get_attribute("data-vnodes"))
                     for e in page.query_selector_all(".ring-server")}
            assert shown == {str(s): int((ring.owners == s).sum()) for s in ring.servers}
            assert len(page.query_selector_all("path.vnode")) == ring.n_vnodes
            seen = sum(sum(s["consistency"]["staleness_histogram"].values()) for s in stats.values())
            bars = sum(int(e.get_attribute("data-count")) for e in page.query_selector_all("rect.bucket"))
            assert bars == seen > 0  # every pull answered is in the staleness chart
            pv = client.job.status()["progressive"]["all"]  # every example scored before its update
            assert pv["examples"] == 30_000 and 0.5 < pv["auc"] < 1
            assert get(scrape(cluster.http_url + "metrics"), "paramserver_progressive_auc",
                       window="all") == pytest.approx(pv["auc"])
            page.wait_for_function("n => document.querySelector('#progressive').textContent.includes("
                                   "'whole run: log loss ' + n)", arg=f"{pv['logloss']:.4f}", timeout=30_000)
            pushed = sum(float(e.get_attribute("data-push-keys")) for e in page.query_selector_all("tr.server"))
            assert pushed == get(scrape(cluster.http_url + "metrics"), "paramserver_push_keys_total",
                                 table=cfg.model.table)  # the page and /metrics: the same numbers
            assert len(page.query_selector_all("#throughput polyline")) == 3
            assert "running" in page.inner_text("#state")
            page.screenshot(path=str(shot), full_page=True)
        finally:
            browser.close()
    assert shot.stat().st_size > 10_000
    if os.environ.get("PARAMSERVER_KEEP_SCREENSHOT"):
        shutil.copy(shot, os.environ["PARAMSERVER_KEEP_SCREENSHOT"])


def test_top_shows_the_servers_of_a_running_cluster_and_refuses_a_dead_address():
    import subprocess
    import sys

    with LocalCluster(servers=2, log_level="WARNING") as cluster:
        client = cluster.client
        client.create_table("t", dim=1)
        client.push("t", np.arange(500, dtype=np.uint64), np.ones((500, 1), np.float32)).result(timeout=30)
        proc = subprocess.run([sys.executable, "-m", "paramserver", "top", "--scheduler", cluster.address, "--once"],
                              capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "160"})
        assert proc.returncode == 0, proc.stderr
        stats = client.stats.server_stats()
        for s in stats:  # each server's row: its id, its address and its keys
            row = next(line for line in proc.stdout.splitlines() if f" {s['node_id']} " in line and "tcp://" in line)
            assert str(s["tables"]["t"]["keys"]) in row
        assert "2 server(s)" in proc.stdout
    proc = subprocess.run([sys.executable, "-m", "paramserver", "top", "--scheduler", "tcp://127.0.0.1:1", "--once"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "nothing listens at tcp://127.0.0.1:1" in proc.stderr


def test_keep_dashboard_leaves_the_page_up_after_the_report_until_ctrl_c(tmp_path):
    """``train --keep-dashboard`` (issue 33.13): the report is printed, then the dashboard
    still answers with the finished job, until Ctrl-C ends the command cleanly."""
    import re
    import signal
    import subprocess
    import sys
    import time

    data = str(tmp_path / "d.tsv")
    write_synth(data, 5_000, seed=4)
    proc = subprocess.Popen([sys.executable, "-m", "paramserver", "train", "--data", data, "--keep-dashboard",
                             "--quiet"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_ctrl_c_heard)  # as from a terminal, even where the tests run in the background
    try:
        err = ""
        deadline = time.monotonic() + 120
        while "stays up" not in err:
            assert time.monotonic() < deadline and proc.poll() is None, err
            err += proc.stderr.readline()
        url = re.search(r"dashboard (http://\S+?)(\?token=\S+)?\s", err).group(1)
        state = json.loads(urllib.request.urlopen(url + "api/state", timeout=30).read())
        assert state["job"]["finished"] and state["job"]["examples"] == 5_000
        proc.send_signal(signal.SIGINT)
        out, rest = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    assert proc.returncode == 0, err + rest
    assert "paramserver train" in out and "Traceback" not in rest


def _ctrl_c_heard() -> None:
    """A child's SIGINT as a terminal's job has it: a shell without job control starts its
    background commands with SIGINT ignored, and their children inherit that (the command
    would then sleep through the test's Ctrl-C)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)
