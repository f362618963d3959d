"""End-to-end training: quality on real data, bad input, exactly once, saved models."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from support import shared

from paramserver.apps.ctr import test_set
from paramserver.apps.ctr.modelfile import evaluate, predict_file
from paramserver.apps.ctr.models import Model
from paramserver.apps.ctr.synth import write_synth
from paramserver.apps.ctr.train import TrainConfig, run_training
from paramserver.data.reader import DataFormat, make_shards, read_all

# Vowpal Wabbit 9.11, one pass, --loss_function logistic -b 24, on the same files (issue 11's
# table, measured 2026-11-23): the defaults must match its log loss and its AUC (less 0.005).
VW = {"a9a": (0.3246, 0.9019), "criteo": (0.4915, 0.7016)}


def test_a9a_one_pass_at_default_flags_matches_vowpal_wabbit():
    train, test = shared("libsvm/a9a.libsvm.gz"), shared("libsvm/a9a.t.libsvm.gz")
    cfg = TrainConfig(Model("lr"), DataFormat("libsvm", label_format="pm1"))  # the CLI's defaults
    report = run_training(cfg, [train], [test], servers=1, workers=1)
    assert report["examples"] == 32_561 and report["test_examples"] == 16_281
    assert report["logloss"] <= VW["a9a"][0] and report["auc"] >= VW["a9a"][1] - 0.005, report
    spread = run_training(cfg, [train], [test], servers=2, workers=2)  # the earlier acceptance check
    assert spread["logloss"] <= 0.330, spread


def test_criteo_sample_lr_and_fm_at_default_flags_match_vowpal_wabbit():
    train = shared("criteo/criteo_kaggle_wideresdnn_train.tsv.gz")
    test = [shared("criteo/criteo_kaggle_wideresdnn_dev.tsv.gz"), shared("criteo/criteo_kaggle_wideresdnn_test.tsv.gz")]
    # two servers: pulled and pushed, rows a batch stale; the depth fixed at link's 2 on one machine, which
    # pings of 1 ms and more (a loaded machine's, rarely) would deepen for LR alone (an FM stays at 2)
    lr = run_training(TrainConfig(Model("lr"), pipeline=2), [train], test, servers=2, workers=1)
    fm = run_training(TrainConfig(Model("fm"), pipeline=2), [train], test, servers=2, workers=1)
    assert lr["examples"] == 7_200 and lr["test_examples"] == 800
    for report in (lr, fm):
        assert report["logloss"] <= VW["criteo"][0] and report["auc"] >= VW["criteo"][1] - 0.005, report
    # FM ties LR here (7 200 rows are too few to learn interactions; it wins on mushrooms): within 1e-4
    assert fm["logloss"] <= lr["logloss"] + 1e-4 and fm["auc"] >= lr["auc"] - 1e-3, (fm, lr)


def test_every_example_once_per_epoch_across_workers_and_shards(tmp_path):
    path = str(tmp_path / "synth.tsv")
    write_synth(path, 30_000, seed=3)
    cfg = TrainConfig(Model("lr"), epochs=2, batch_size=500)
    report = run_training(cfg, [path], [], servers=2, workers=2, shard_bytes=400_000)
    assert report["examples"] == 60_000
    assert report["bytes_sent"] > 0 and report["bytes_received"] > 0


def test_a_row_cache_trains_every_example_once_with_fewer_key_operations_and_says_so(tmp_path):
    path, test = str(tmp_path / "synth.tsv"), str(tmp_path / "test.tsv")
    write_synth(path, 30_000, seed=3)
    write_synth(test, 3_000, seed=4)
    reports = {rc: run_training(TrainConfig(Model("lr"), epochs=2, batch_size=500, row_cache=rc), [path], [test],
                                servers=2, workers=2, shard_bytes=400_000) for rc in ("off", "s=4,rows=4096")}
    cached, plain = reports["s=4,rows=4096"], reports["off"]
    assert cached["examples"] == plain["examples"] == 60_000
    assert cached["row_cache"]["hits"] > 0 and cached["row_cache"]["sums_held"] == 0
    assert cached["row_cache"]["lag_p99"] <= 4
    assert cached["key_ops_per_example"] < plain["key_ops_per_example"]
    # two asynchronous workers: either run's loss moves with timing (0.0002-0.0025 apart on a quiet
    # machine, 0.0105 once under load); the bound is for a cache that broke learning
    assert abs(cached["logloss"] - plain["logloss"]) < 0.02


def test_one_worker_whose_cache_trains_its_rows_learns_the_uncached_model_in_fewer_key_operations(tmp_path):
    """Issue 46: at one worker a cache that trains its rows (``apply=local``, the default for LR's
    FTRL) reads every step of its own, so its model is the uncached one's whatever ``s``; gradients
    summed for the server (``apply=server``) at the same bound are not."""
    path, test = str(tmp_path / "heavy.tsv"), str(tmp_path / "test.tsv")
    write_synth(path, 60_000, seed=3, shape="heavy")
    write_synth(test, 6_000, seed=4, shape="heavy")
    reports = {rc: run_training(TrainConfig(Model("lr"), row_cache=rc, steps="off"), [path], [test], servers=1,
                                workers=1) for rc in ("off", "s=100", "s=100,apply=server")}
    local, plain, summed = reports["s=100"], reports["off"], reports["s=100,apply=server"]
    assert local["row_cache"]["apply"] == "local" and summed["row_cache"]["apply"] == "server"
    assert local["key_ops_per_example"] < plain["key_ops_per_example"] / 2, (local["key_ops_per_example"],
                                                                            plain["key_ops_per_example"])
    # within issue 46's +0.001 (a little better, even: the held rows are read after the step before, which
    # the pipeline's pulls without a cache are not); the sums miss it by far
    assert local["logloss"] < plain["logloss"] + 1e-3, (local["logloss"], plain["logloss"])
    assert summed["logloss"] > local["logloss"] + 3e-3, (summed["logloss"], local["logloss"])


def cli(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "paramserver", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "CI": "1"})


def test_corrupted_line_stops_with_its_line_number_or_is_skipped_and_counted(tmp_path):
    path = tmp_path / "data.tsv"
    write_synth(str(path), 2_000, seed=4)
    lines = path.read_text().splitlines(keepends=True)
    lines[1233] = "1\tnot\ta\tcriteo\tline\n"
    path.write_text("".join(lines))
    bad = cli("train", "--data", str(path), "--quiet")
    assert bad.returncode == 2
    assert f"{path}:1234:" in bad.stderr and "'1\\tnot\\ta\\tcriteo\\tline'" in bad.stderr
    assert "Traceback" not in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
    metrics = tmp_path / "m.json"
    ok = cli("train", "--data", str(path), "--skip-bad-lines", "--quiet", "--metrics-out", str(metrics))
    assert ok.returncode == 0, ok.stderr
    report = json.loads(metrics.read_text())
    assert report["bad_lines"] == 1 and report["examples"] == 1_999


def test_a_job_given_no_example_is_an_error_not_an_empty_model(tmp_path):
    """Files of only blank lines, only a header, or only malformed lines skipped trained 0
    examples and exited 0 with a report; --max-bad-fraction was never checked where no
    line of a shard was good."""
    blank, header, bad = tmp_path / "blank.tsv", tmp_path / "header.csv", tmp_path / "bad.tsv"
    blank.write_text("\n\n\n")
    header.write_text("y,a,b\n")
    bad.write_text("garbage\n" * 500)
    for args, said in [(["--data", str(blank)], f"no examples in {blank}: every line is blank"),
                       (["--data", str(header), "--format", "csv", "--label", "y"], f"no examples in {header}"),
                       (["--data", str(bad), "--skip-bad-lines"], "500 of the 500 lines read so far are malformed"),
                       (["--data", str(bad), "--skip-bad-lines", "--max-bad-fraction", "1"],
                        f"no examples in {bad}: its 500 lines with data are all malformed")]:
        done = cli("train", "--quiet", *args)
        assert done.returncode == 2 and said in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_a_malformed_test_file_is_said_in_one_line_before_the_job(tmp_path):
    """On a machine without a core to spare the test rows are read after the job: their
    first rows are parsed before it all the same, so a wrong file is said at once."""
    data, test = tmp_path / "train.tsv", tmp_path / "test.tsv"
    write_synth(str(data), 2_000, seed=4)
    test.write_text("1 3:1 7:0.5\n" * 10)  # LIBSVM rows given as Criteo ones
    bad = cli("train", "--data", str(data), "--test", str(test), "--quiet")
    assert bad.returncode == 2
    assert f"{test}:1:" in bad.stderr and "Traceback" not in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("args,message", [
    (["--data", "/nonexistent/x.tsv"], "no such file: /nonexistent/x.tsv"),
    (["--data", "{synth}", "--optimizer", "ftrl:alpha=-1"], "ftrl alpha must be > 0"),
    (["--data", "{synth}", "--model", "svm"], "--model must be one of lr, fm, deepfm, wdl, got 'svm'"),
    (["--data", "{synth}", "--format", "parquet"], "--format must be one of"),
    (["--data", "{synth}", "--servers", "0"], "--servers must be a whole number >= 1, got 0"),
    (["--data", "{synth}", "--workers", "-1"], "--workers must be a whole number >= 1, got -1"),
    (["--data", "{synth}", "--batch-size", "99999999999"], "--batch-size must be a whole number in [1, 16,777,216]"),
    (["--data", "{synth}", "--shard-mb", "0"], "--shard-mb must be > 0"),
    (["--data", "{tmp}/nothing*.tsv"], "no file matches"),
    (["--data", "{synth}", "--optimizer", "ftrl:alpha"], "parameters are key=value, got 'alpha'"),
    (["--data", "{synth}", "--format", "csv"], "--format csv needs --label COLUMN"),
    (["--data", "{synth}", "--format", "libsvm", "--label-format", "01"], "s.tsv:1: a feature is not of the "
                                                                          "form index:value"),
    (["--data", "{synth}", "--checkpoint-dir", "{tmp}/ck", "--checkpoint-every", "0"],
     "--checkpoint-every must be an int >= 1 (data shards done between two checkpoints), got 0"),
    (["--data", "{synth}", "--checkpoint-every", "5"], "--checkpoint-every 5 needs --checkpoint-dir URL"),
    (["--data", "{synth}", "--filters", "push=nosuch"], "--filters 'push=nosuch': unknown filter 'nosuch'"),
    (["--data", "{synth}", "--filters", "push=zstd,int8"], "list them in the order select > values > keys > bytes"),
    (["--data", "{synth}", "--row-cache", "s=-2"], "--row-cache 's=-2': row cache 's=-2': s must be in [0, "),
    (["--data", "{synth}", "--resume", "{tmp}"], "no complete checkpoint under"),
    (["--data", "{synth}", "--resume", "{tmp}/nothing"], "no checkpoint at"),
])
def test_bad_arguments_are_one_clear_line(tmp_path, args, message):
    synth = str(tmp_path / "s.tsv")
    write_synth(synth, 100)
    proc = cli("train", *[a.replace("{synth}", synth).replace("{tmp}", str(tmp_path)) for a in args], "--quiet")
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_saved_model_predicts_and_evaluates_without_a_cluster(tmp_path):
    train, test = str(tmp_path / "train.tsv"), str(tmp_path / "test.tsv.gz")
    write_synth(train, 20_000, seed=1)
    write_synth(test, 3_000, seed=2)
    model_dir = str(tmp_path / "model")
    report = run_training(TrainConfig(Model("fm", k=4), batch_size=500), [train], [test], servers=2,
                          workers=1, save=model_dir)
    offline = evaluate(model_dir, [test])
    assert offline["examples"] == 3_000
    assert offline["logloss"] == pytest.approx(report["logloss"], rel=1e-6)
    assert offline["auc"] == pytest.approx(report["auc"], rel=1e-6)
    out = tmp_path / "preds.txt"
    assert predict_file(model_dir, [test], str(out)) == 3_000
    preds = np.loadtxt(out)
    assert preds.shape == (3_000,) and ((preds > 0) & (preds < 1)).all()
    proc = cli("eval", "--model", model_dir, "--data", test)
    assert proc.returncode == 0 and json.loads(proc.stdout)["examples"] == 3_000
    assert "never seen in training" not in proc.stderr
    other = tmp_path / "other.tsv"  # rows of other features: said on stderr, as predict says it
    other.write_text("".join(f"{i % 2}" + "\t" * 13 + "\t" + "\t".join(f"{i:04x}{c:04x}" for c in range(26)) + "\n"
                             for i in range(500)))
    proc = cli("eval", "--model", model_dir, "--data", str(other))
    assert proc.returncode == 0 and "of the rows' features were never seen in training" in proc.stderr, proc.stderr
    proc = cli("eval", "--model", str(tmp_path), "--data", test)
    assert proc.returncode == 2 and "is not a saved model" in proc.stderr


def test_parsed_shard_cache_gives_the_same_training(tmp_path):
    path = str(tmp_path / "synth.tsv")
    write_synth(path, 8_000, seed=6)
    lines = open(path).read().splitlines(keepends=True)
    lines[100] = "garbage\n"
    open(path, "w").writelines(lines)
    cache = str(tmp_path / "cache")
    plain = TrainConfig(Model("lr"), DataFormat("criteo", skip_bad=True), epochs=2, batch_size=500)
    cached = TrainConfig(Model("lr"), DataFormat("criteo", skip_bad=True, cache_dir=cache), epochs=2,
                         batch_size=500)
    a = run_training(plain, [path], [path], servers=1, workers=1, shard_bytes=600_000)
    b = run_training(cached, [path], [path], servers=1, workers=1, shard_bytes=600_000)
    shards = make_shards([path], 600_000)
    assert len(shards) > 1
    # one file per training shard (written in epoch 1, read in epoch 2) and one for each byte range
    # the test file is read in once the job is done
    assert len(os.listdir(cache)) == len(shards) + test_set.READERS
    c = run_training(cached, [path], [path], servers=1, workers=1, shard_bytes=600_000)  # all from cache
    for r in (a, b, c):
        assert r["examples"] == 2 * 7_999 and r["bad_lines"] == 2
    assert a["logloss"] == b["logloss"] == c["logloss"]


def test_dense_and_hash_layouts_train_the_same_model(tmp_path):
    path = str(tmp_path / "synth.tsv")
    write_synth(path, 6_000, seed=8)
    reports = {}
    for layout in ("hash", "dense"):
        # two servers: pulled and pushed; the depth fixed (``link`` deepens where pings take 1 ms or more,
        # as a loaded machine's rarely can, and a deeper pipeline trains another model)
        cfg = TrainConfig(Model("lr"), DataFormat("criteo", hash_bits=16), batch_size=500, layout=layout, pipeline=2)
        reports[layout] = run_training(cfg, [path], [path], servers=2, workers=1, save=str(tmp_path / layout))
    assert reports["dense"]["logloss"] == reports["hash"]["logloss"]  # one worker: the same updates, bitwise
    saved = {}
    for layout in reports:
        with np.load(tmp_path / layout / "table.npz") as f:
            order = np.argsort(f["keys"])
            saved[layout] = (f["keys"][order], f["values"][order])
    np.testing.assert_array_equal(saved["dense"][0], saved["hash"][0])
    np.testing.assert_array_equal(saved["dense"][1], saved["hash"][1])
    assert json.load(open(tmp_path / "dense" / "model.json"))["table"]["key_bits"] == 16


def test_avazu_csv_trains_from_the_cli_with_its_header_and_without(tmp_path):
    train = shared("avazu/avazu_wideresdnn_train.csv.gz")  # has a header
    test = shared("avazu/avazu_wideresdnn_test.csv.gz")  # has none: Avazu's columns
    out = tmp_path / "report.json"
    done = subprocess.run([sys.executable, "-m", "paramserver", "train", "--quiet", "--format", "avazu", "--data",
                           train, "--test", test, "--metrics-out", str(out)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text())
    assert report["examples"] == 8_087 and report["test_examples"] == 432
    assert report["logloss"] < 0.44 and report["auc"] > 0.72, report  # VW one pass: 0.4318 / 0.7393


def test_a_quoted_glob_reads_every_file_it_matches(tmp_path):
    for i in range(2):
        write_synth(str(tmp_path / f"part-{i}.tsv"), 300, seed=i)
    out = tmp_path / "r.json"
    proc = cli("train", "--data", str(tmp_path / "part-*.tsv"), "--test", str(tmp_path / "part-1.tsv"), "--quiet",
               "--metrics-out", str(out))
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out.read_text())
    assert report["examples"] == 600 and report["test_examples"] == 300


def test_a_remote_url_without_its_fsspec_driver_is_one_line(tmp_path):
    try:
        import s3fs  # noqa: F401
        pytest.skip("s3fs is installed here: the missing-driver error cannot happen")
    except ImportError:
        pass
    proc = cli("train", "--data", "s3://bucket/train.tsv", "--quiet")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "s3://bucket/train.tsv: Install s3fs" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_demo_checks_its_cluster_before_writing_data():
    proc = cli("demo", "--servers", "0")
    assert proc.returncode == 2 and "--servers must be a whole number >= 1, got 0" in proc.stderr
    assert "writing" not in proc.stderr and "Traceback" not in proc.stderr


def test_a_scheduler_port_in_use_is_one_line():
    import socket
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = cli("scheduler", "--port", str(port), timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert f"cannot listen on 127.0.0.1:{port}: Address already in use" in proc.stderr
    assert "pick another --port, or 0" in proc.stderr


@pytest.mark.parametrize("flags,message", [
    (["--save", "s3://bucket/model"], "--save s3://bucket/model: Install s3fs"),
    (["--save", "{file}"], "is a file; name a folder"),
    (["--checkpoint-dir", "{file}"], "--checkpoint-dir {file} is a file; name a folder"),
    (["--metrics-out", "{tmp}"], "--metrics-out {tmp} is a folder; name a file"),
    (["--metrics-out", "/proc/no/such/report.json"], "--metrics-out /proc/no/such/report.json cannot be written"),
])
def test_every_output_is_checked_before_the_job_starts(tmp_path, flags, message):
    synth, existing = str(tmp_path / "s.tsv"), str(tmp_path / "a-file")
    write_synth(synth, 100)
    open(existing, "w").close()
    fill = {"{file}": existing, "{tmp}": str(tmp_path)}
    flags = [fill.get(f, f) for f in flags]
    for k, v in fill.items():
        message = message.replace(k, v)
    if "s3://" in flags[-1]:
        try:
            import s3fs  # noqa: F401
            pytest.skip("s3fs is installed here")
        except ImportError:
            pass
    proc = cli("train", "--data", synth, "--quiet", *flags)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    assert "examples" not in proc.stdout  # nothing trained


def test_a_model_saved_to_an_fsspec_url_loads_and_predicts_the_same(tmp_path):
    from paramserver.apps.ctr.modelfile import LocalModel
    train = str(tmp_path / "t.tsv")
    write_synth(train, 2000, seed=4)
    cfg = TrainConfig(Model("lr"))
    run_training(cfg, [train], [], servers=1, workers=1, save="memory://paramserver-test/model")
    run_training(cfg, [train], [], servers=1, workers=1, save=str(tmp_path / "model"))
    assert not os.path.exists("memory:")  # not a local folder named after the scheme
    batch = read_all([train], cfg.data)
    np.testing.assert_array_equal(LocalModel("memory://paramserver-test/model").proba(batch),
                                  LocalModel(str(tmp_path / "model")).proba(batch))


def test_help_shows_defaults_and_version_is_there():
    proc = cli("train", "--help")
    assert proc.returncode == 0
    text = " ".join(proc.stdout.split())
    for flag in ("--servers SERVERS server processes of the cluster (default: 1)",
                 "--seed SEED seed of the tables' initial values (default: 0)", "(default 24:"):
        assert flag in text, flag
    version = cli("--version")
    assert version.returncode == 0 and version.stdout.startswith("paramserver ")


def test_predict_scores_rows_without_labels_as_it_scores_them_with(tmp_path):
    """Issue 12, bug 9: Criteo's test.txt has 39 fields (no label); LIBSVM rows may have none."""
    from paramserver.apps.ctr.modelfile import predict_file
    train = str(tmp_path / "t.tsv")
    write_synth(train, 3000, seed=8)
    model = str(tmp_path / "model")
    run_training(TrainConfig(Model("lr")), [train], [], servers=1, workers=1, save=model)
    lines = open(train).read().splitlines(keepends=True)
    unlabeled = tmp_path / "test.txt"
    unlabeled.write_text("".join(line.split("\t", 1)[1] for line in lines))
    predict_file(model, [train], str(tmp_path / "a.txt"))
    predict_file(model, [str(unlabeled)], str(tmp_path / "b.txt"))
    np.testing.assert_array_equal(np.loadtxt(tmp_path / "a.txt"), np.loadtxt(tmp_path / "b.txt"))

    svm = tmp_path / "s.svm"
    svm.write_text("".join(f"{i % 2} {i % 7 + 1}:1 {i % 5 + 9}:0.5\n" for i in range(200)))
    svm_model = str(tmp_path / "svm-model")
    run_training(TrainConfig(Model("lr"), DataFormat("libsvm")), [str(svm)], [], servers=1, workers=1,
                 save=svm_model)
    bare = tmp_path / "bare.svm"
    bare.write_text("".join(line.split(" ", 1)[1] for line in svm.read_text().splitlines(keepends=True)))
    predict_file(svm_model, [str(svm)], str(tmp_path / "c.txt"))
    predict_file(svm_model, [str(bare)], str(tmp_path / "d.txt"))
    np.testing.assert_array_equal(np.loadtxt(tmp_path / "c.txt"), np.loadtxt(tmp_path / "d.txt"))


def test_train_says_where_its_scheduler_and_logs_are_and_keeps_them_with_log_dir(tmp_path):
    data = str(tmp_path / "d.tsv")
    write_synth(data, 500)
    logs = tmp_path / "logs"
    proc = subprocess.run([sys.executable, "-m", "paramserver", "train", "--data", data, "--log-dir", str(logs)],
                          capture_output=True, text=True, timeout=120, env={k: v for k, v in os.environ.items()
                                                                            if k != "CI"})  # progress shown
    assert proc.returncode == 0, proc.stderr
    shown = " ".join(proc.stderr.split())  # the terminal may wrap the progress line
    assert "scheduler tcp://127.0.0.1:" in shown and f"logs {logs}" in shown
    assert {p.name for p in logs.iterdir()} >= {"scheduler.log", "server-0.log", "worker-0.log"}


def test_eval_and_predict_read_a_training_checkpoint(tmp_path):
    """Issue 12 friction: eval and predict could not read a checkpoint."""
    data = str(tmp_path / "d.tsv")
    write_synth(data, 3000, seed=9)
    model, ckpt = str(tmp_path / "model"), str(tmp_path / "ckpt")
    run_training(TrainConfig(Model("fm", k=4)), [data], [], servers=2, workers=1, save=model, checkpoint_dir=ckpt)
    saved, checkpointed = evaluate(model, [data]), evaluate(ckpt, [data])  # the checkpoint after the last shard
    assert saved == checkpointed
    proc = cli("eval", "--model", ckpt, "--data", data)
    assert proc.returncode == 0 and json.loads(proc.stdout)["logloss"] == pytest.approx(saved["logloss"])


def test_train_and_predict_read_standard_input(tmp_path):
    """Issue 12 friction: --data - (VW users pipe into it)."""
    data = tmp_path / "d.tsv"
    write_synth(str(data), 2000, seed=3)
    text = data.read_text()
    model, report = tmp_path / "model", tmp_path / "r.json"
    proc = subprocess.run([sys.executable, "-m", "paramserver", "train", "--data", "-", "--quiet", "--save", str(model),
                           "--metrics-out", str(report), "--epochs", "2"], input=text, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(report.read_text())["examples"] == 4000  # read once, trained twice
    unlabeled = "".join(line.split("\t", 1)[1] + "\n" for line in text.splitlines())
    out = tmp_path / "p.txt"
    proc = subprocess.run([sys.executable, "-m", "paramserver", "predict", "--model", str(model), "--data", "-",
                           "--out", str(out)], input=unlabeled, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert len(out.read_text().splitlines()) == 2000
    empty = subprocess.run([sys.executable, "-m", "paramserver", "train", "--data", "-"], input="",
                           capture_output=True, text=True, timeout=60)
    assert empty.returncode == 2 and "standard input is empty" in empty.stderr


def test_train_reads_its_test_rows_from_standard_input_and_not_both(tmp_path):
    """``--test -``: the test rows piped in, all of them scored (its head is not read ahead to check it:
    a pipe's head read is gone); ``--data - --test -`` is refused by name, not "no examples in -"."""
    data, test = tmp_path / "d.tsv", tmp_path / "t.tsv"
    write_synth(str(data), 2000, seed=3)
    write_synth(str(test), 700, seed=4)
    report = tmp_path / "r.json"
    proc = subprocess.run([sys.executable, "-m", "paramserver", "train", "--data", str(data), "--test", "-", "--quiet",
                           "--metrics-out", str(report)], input=test.read_text(), capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(report.read_text())["test_examples"] == 700
    both = subprocess.run([sys.executable, "-m", "paramserver", "train", "--data", "-", "--test", "-", "--quiet"],
                          input=test.read_text(), capture_output=True, text=True, timeout=60)
    assert both.returncode == 2 and "--data - and --test -" in both.stderr


def test_eval_and_predict_say_what_a_folder_or_a_stray_flag_is_and_predict_writes_to_stdout(tmp_path):
    """Issue 33.4: a raw "[Errno 21] Is a directory", `--out -` written to a file named "-",
    and --label-format pm1 silently ignored with --format criteo."""
    train, test = str(tmp_path / "train.tsv"), str(tmp_path / "test.tsv")
    write_synth(train, 3_000, seed=1)
    write_synth(test, 50, seed=2)
    model = str(tmp_path / "model")
    assert cli("train", "--data", train, "--quiet", "--save", model).returncode == 0
    for command in (("eval",), ("predict", "--out", str(tmp_path / "p.txt"))):
        proc = cli(*command, "--model", model, "--data", str(tmp_path))
        assert proc.returncode == 2 and f"{tmp_path} is a directory; pass the files in it" in proc.stderr
    proc = cli("predict", "--model", model, "--data", test, "--out", "-")
    assert proc.returncode == 0 and not (tmp_path / "-").exists() and not os.path.exists("-")
    preds = np.array(proc.stdout.split(), float)
    assert preds.shape == (50,) and ((preds > 0) & (preds < 1)).all()
    proc = cli("eval", "--model", model, "--data", test, "--label-format", "pm1")
    assert proc.returncode == 2 and "--label-format pm1 applies to --format libsvm" in proc.stderr


@pytest.mark.parametrize("model", [Model("lr"), Model("fm", k=4)])
def test_a_job_of_4_byte_keys_trains_the_model_one_of_8_byte_keys_does(tmp_path, monkeypatch, model):
    """``train``'s table keeps its folded features in 4 bytes (``TableSpec.key_bytes``): the same
    steps, the same model to the bit, in less memory a key."""
    data, test = str(tmp_path / "d.tsv"), str(tmp_path / "t.tsv")
    write_synth(data, 6_000, seed=11, shape="heavy")
    write_synth(test, 500, seed=12, shape="heavy")
    runs, narrows = {}, TrainConfig.narrow_keys
    for narrow in (True, False):
        monkeypatch.setattr(TrainConfig, "narrow_keys", lambda self, spec, n=narrow: n and narrows(self, spec))
        saved = str(tmp_path / f"model-{narrow}")
        report = run_training(TrainConfig(model), [data], [test], servers=2, workers=1, save=saved)
        runs[narrow] = (report, evaluate(saved, [test]))
    (narrow, narrow_eval), (wide, wide_eval) = runs[True], runs[False]
    assert narrow["key_bytes"] == 4 and wide["key_bytes"] == 8
    assert narrow["train_logloss"] == wide["train_logloss"] and narrow["logloss"] == wide["logloss"]
    assert narrow_eval == wide_eval
    assert narrow["bytes_per_key"] < wide["bytes_per_key"]
