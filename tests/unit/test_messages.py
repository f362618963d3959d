"""Issue 43's messages (items 21, 22, 24, 25): a resume refused flag by flag with the command
that resumes, a duplicated key of a spec refused, the report's storage and bytes a key, the
prewarm's progress."""

import math
import os

import pytest

from paramserver.apps.ctr.models import Model
from paramserver.apps.ctr.resume import _check_tables
from paramserver.apps.ctr.train_config import TrainConfig
from paramserver.data.reader import DataFormat
from paramserver.errors import ConfigError
from paramserver.filters.chain import FilterSpec
from paramserver.lifecycle.spec import Lifecycle


# ---- 24: a key given twice in a spec ---------------------------------------------------------------
@pytest.mark.parametrize("text, said", [
    ("push=int8;push=fp16", "the direction 'push' is given twice (push=int8 and push=fp16)"),
    ("push=keycache;pull=keycache;push=zstd", "the direction 'push' is given twice (push=keycache and push=zstd)"),
    ("push=int8,keycache,int8", "filters for push: int8 listed twice"),
    ("push=int8:block=128:block=64", "the setting 'block' is given twice"),
])
def test_a_filter_spec_that_gives_a_key_twice_is_refused_with_the_fix(text, said):
    with pytest.raises(ConfigError, match="give it once|list each filter once") as refused:
        FilterSpec.parse(text)
    assert said in str(refused.value)


def test_a_duplicated_direction_is_refused_on_the_command_line_flag():
    with pytest.raises(ConfigError, match=r"--filters 'push=int8;push=fp16': .*'push=int8' or 'push=fp16'"):
        TrainConfig(filters="push=int8;push=fp16")


@pytest.mark.parametrize("text, said", [
    ("ttl=1e6;ttl=2e6", "ttl is given twice (ttl=1e6 and ttl=2e6)"),
    ("admit=after:2;ttl=5e6;admit=prob:0.5", "admit is given twice (admit=after:2 and admit=prob:0.5)"),
    ("track;track", "track is given twice"),
    ("admit=after:n=2,n=3", "the setting 'n' is given twice"),
])
def test_a_lifecycle_spec_that_gives_a_setting_twice_is_refused(text, said):
    with pytest.raises(ConfigError, match="give (each setting|it) once") as refused:
        Lifecycle.parse(text)
    assert said in str(refused.value)


def test_specs_that_give_each_key_once_still_parse():
    assert str(FilterSpec.parse("push=int8,keycache;pull=keycache;reply=fp16")) == \
        "push=int8,keycache;pull=keycache;reply=fp16"
    assert str(Lifecycle.parse("admit=after:2;ttl=1e6;cap_keys=1000")) == "admit=after:2;ttl=1e+06;cap_keys=1000"


# ---- 21: a resume refused flag by flag ----------------------------------------------------------------
def _manifest(cfg: TrainConfig) -> dict:
    spec = cfg.table_spec(None)
    return {"tables": {spec.name: spec.to_wire()},
            "train": {"model": {"name": cfg.model.name, "k": cfg.model.k, "l2": cfg.model.l2,
                                "hidden": list(cfg.model.hidden)}}}


def test_a_resume_with_other_settings_names_each_flag_both_values_and_the_command(monkeypatch):
    checkpointed = TrainConfig(Model("fm", k=4), DataFormat("criteo"), storage="fp16",
                               lifecycle="admit=after:2;ttl=1e6")
    asked = TrainConfig(Model("fm", k=4), DataFormat("criteo"), seed=3)
    monkeypatch.setattr("sys.argv", ["/venv/bin/paramserver", "train", "--data", "a b.tsv", "--resume", "ck",
                                     "--storage=float32", "--seed", "3", "--model", "fm", "--k", "4"])
    with pytest.raises(ConfigError) as refused:
        _check_tables("ck/step-9", _manifest(checkpointed), asked.table_spec(None), asked)
    said = str(refused.value)
    assert "--storage: the checkpoint has fp16, this command asks float32" in said
    assert "--lifecycle: the checkpoint has 'admit=after:2;ttl=1e+06', this command asks none" in said
    assert "--seed: the checkpoint has 0, this command asks 3" in said
    assert "--optimizer" not in said and "{" not in said and len(said) < 600  # no table dicts
    assert said.endswith("resume with the checkpoint's settings: paramserver train --data 'a b.tsv' --resume ck "
                         "--model fm --k 4 --seed 0 --lifecycle 'admit=after:2;ttl=1e+06' --storage fp16")


@pytest.mark.parametrize(("data", "said"), [
    (DataFormat("criteo", hash_bits=20), "read its rows with --hash-bits 24, this command with --hash-bits 20"),
    (DataFormat("libsvm"), "read its rows with --format criteo, this command with --format libsvm"),
])
def test_a_resume_whose_data_flags_make_other_keys_is_refused(data, said):
    """--hash-bits 20 over a 24-bit checkpoint trained other keys into the same table, without a word."""
    from dataclasses import asdict

    checkpointed = TrainConfig(Model("lr"), DataFormat("criteo"), layout="hash")
    manifest = _manifest(checkpointed)
    manifest["train"]["data"] = {k: list(v) if isinstance(v, tuple) else v
                                 for k, v in asdict(checkpointed.data).items()}
    _check_tables("ck/step-9", manifest, checkpointed.table_spec(None), checkpointed)  # the same: taken
    asked = TrainConfig(Model("lr"), data, layout="hash")
    with pytest.raises(ConfigError, match=f"--resume ck/step-9: the checkpointed job {said}: a feature's key"):
        _check_tables("ck/step-9", manifest, asked.table_spec(None), asked)


def test_a_resume_from_python_is_told_the_flags_to_pass(monkeypatch):
    monkeypatch.setattr("sys.argv", ["pytest"])
    checkpointed = TrainConfig(Model("lr"), storage="bf16")
    asked = TrainConfig(Model("lr"))
    with pytest.raises(ConfigError, match=r"--storage: the checkpoint has bf16, this command asks float32; "
                                          r"pass the checkpoint's --storage bf16$"):
        _check_tables("ck/step-9", _manifest(checkpointed), asked.table_spec(None), asked)


# ---- 22: the report says the table's storage and bytes a key, lifecycle or not ------------------------
class _Stats:
    """A client whose servers hold ``keys`` keys of table t (two copies) in ``nbytes``."""

    def __init__(self, keys: int, nbytes: int):
        self.keys, self.nbytes = keys, nbytes
        self.stats = self  # client.stats.server_stats

    def server_stats(self):
        one = {"keys": self.keys, "primary_keys": self.keys // 2, "bytes": self.nbytes // 2}
        return [{"tables": {"t": one}, "rss_bytes": 100}, {"tables": {"t": one}, "rss_bytes": 100}]


def test_the_table_report_states_storage_and_bytes_a_key_without_a_lifecycle():
    from paramserver.apps.ctr.publishing import table_report
    from paramserver.cli.train_report import lifecycle_lines
    from paramserver.tables.spec import TableSpec

    report = table_report(_Stats(1000, 14_000), TableSpec("t", storage="fp16", replicas=2))
    assert report["storage"] == "fp16" and report["bytes_per_key"] == 7.0 and report["keys"] == 1000
    assert "lifecycle" not in report
    lines = dict(lifecycle_lines({**report, "table_layout": "hash"}))
    assert lines["table storage"] == "hash table, fp16 rows"
    assert lines["keys held"] == "1,000 (7.0 bytes a key, all copies)"
    dense = dict(lifecycle_lines({**report, "table_layout": "dense", "hash_bits": 20}))
    assert dense["keys held"] == "1,000 (7.0 bytes a key, all copies: arrays of all 2^20 keys)"
    with_life = table_report(_Stats(10, 100), TableSpec("t", lifecycle="ttl=5"))
    assert with_life["storage"] == "float32" and with_life["lifecycle"] == "ttl=5"
    assert dict(lifecycle_lines(with_life))["lifecycle"] == "ttl=5"


# ---- 25: the prewarm says what it does, how long it takes, and how far it is --------------------------
def _prewarm():
    from paramserver.apps import prewarm

    return prewarm


def test_the_prewarm_says_first_what_it_does_then_a_line_a_group_then_the_time():
    import io

    prewarm = _prewarm()
    done, out, now = [], io.StringIO(), iter([0.0, 0.0, 30.0, 30.0, 75.0, 75.0])
    todo = [("server tables, hash layout", lambda: done.append(1)), ("FM", lambda: done.append(2))]
    assert prewarm.run(todo, out, clock=lambda: next(now)) == 75.0
    lines = out.getvalue().splitlines()
    assert done == [1, 2] and len(lines) == 4
    assert "compiling" in lines[0] and "about two minutes" in lines[0] and "once" in lines[0]
    assert lines[1] == "prewarm: [1/2] server tables, hash layout: 30 s" and lines[2] == "prewarm: [2/2] FM: 45 s"
    assert lines[3] == "prewarm: numba's cache filled in 75 s"


def test_the_prewarm_groups_compile_what_the_single_calls_did(monkeypatch):
    """The groups together call the same warm-ups, with the same arguments, as the calls
    they replace (issue 43.25: say more, compile nothing else)."""
    from paramserver._runtime.warm import Warmup

    prewarm = _prewarm()
    calls = []
    for name in ("warm_server", "warm_worker", "warm_filters", "_synth_rows", "_round_apps", "_saved_model"):
        monkeypatch.setattr(prewarm, name, lambda *a, _n=name, **k: calls.append((_n, a, k)))

    def warm_job(*a, **k):
        calls.append(("warm_job", a, k))
        return Warmup(lambda: calls.append(("job servers", (), {})), lambda: calls.append(("job workers", (), {})))

    monkeypatch.setattr(prewarm, "warm_job", warm_job)
    for _, compile_group in prewarm.groups():
        compile_group()
    servers = [(a, k) for n, a, k in calls if n == "warm_server" and "tables" not in k]
    assert {a[0][0] for a, _ in servers} == {"hash", "dense"} and all(k == {"filters": False} for _, k in servers)
    loops = [k["tables"] for n, _, k in calls if n == "warm_server" and "tables" in k]  # the job tables' request loops
    assert [{(t.optimizer.name, t.dim) for t in tables} for tables in loops] == [{("ftrl", 1), ("ftrl_adagrad", 9)}]
    # and train's own warm-up for every job it runs at its default flags, LR and FM in either layout, with the table
    # as it makes it: a hash one keeps 4-byte keys, whose loops a fresh install's first train compiled in its server
    # (4.6 s to its first example) while only 8-byte ones were warmed
    made = [(fmt, m, TrainConfig(model=Model(m), data=DataFormat(fmt), layout=layout).table_spec())
            for fmt, m in prewarm.TRAIN_JOBS for layout in ("hash", "dense")]
    assert [(a[0], a[1].name, a[2]) for n, a, _ in calls if n == "warm_job"] == made
    assert {(fmt, m) for fmt, m, _ in made} >= {("criteo", "lr"), ("criteo", "fm")}
    assert {t.key_bytes for _, _, t in made} == {4, 8}
    jobs = 2 * len(prewarm.TRAIN_JOBS)
    assert [n for n, _, _ in calls].count("job servers") == jobs == [n for n, _, _ in calls].count("job workers")
    # the quick start's Criteo LR and FM workers are warmed by train's own warm-up (above), not a second time
    assert [a for n, a, _ in calls if n == "warm_worker"] == []
    assert [n for n, _, _ in calls].count("warm_filters") == 1 and ("_synth_rows", (), {}) in calls
    # the quick start's install leaves no round app, nor a saved model's predict and eval, to compile at their first run
    assert ("_round_apps", (), {}) in calls and ("_saved_model", (None,), {}) in calls
    calls.clear()
    for _, compile_group in prewarm.groups(everything=True):
        compile_group()
    assert sorted(k["storages"][0] for n, _, k in calls if n == "warm_server" and "storages" in k) == ["bf16", "fp16"]
    rows = {(t.optimizer.name, t.dim) for n, _, k in calls if n == "warm_server" for t in k.get("tables", ())}
    assert {(r, d) for r in prewarm.RULES for d in prewarm.WIDTHS} <= rows
    assert {a[0][0] for n, a, _ in calls if n == "warm_worker"} == {"criteo", "libsvm"}
    assert [n for n, _, _ in calls].count("warm_filters") == 1 and [n for n, _, _ in calls].count("warm_job") == \
        2 * len(prewarm.TRAIN_JOBS)


def test_paramserver_prewarm_runs_the_groups_its_flag_asks_for(monkeypatch):
    """``paramserver prewarm`` (what ``make demo`` installs with, and a ``pip install`` is told to run once):
    the commands' kernels; ``--all`` (``make test``'s) those and the rest."""
    from paramserver.cli.main import COMMANDS, build_parser
    from paramserver.serving.loading import load_once

    prewarm, ran = _prewarm(), []
    monkeypatch.setattr(prewarm, "run", lambda todo: ran.append([what for what, _ in todo]))
    for argv, everything in ((["prewarm"], False), (["prewarm", "--all"], True)):
        assert COMMANDS["prewarm"].run(build_parser("prewarm").parse_args(argv)) == 0
        assert ran[-1] == [what for what, _ in prewarm.groups(everything, served=load_once)]
    assert set(ran[0]) < set(ran[1]) and "a saved model: predict, eval, serve" in ran[0]  # serve --model's warm-up too
    # without the serve extra (no aiohttp) there is no serve to warm, and the prewarm (make demo's install) goes on
    import importlib.util

    from paramserver.cli import prewarm as command

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "aiohttp" else real(name, *a))
    assert command.served() is None
    assert COMMANDS["prewarm"].run(build_parser("prewarm").parse_args(["prewarm"])) == 0
    assert "a saved model: predict, eval" in ran[-1]


def test_the_prewarm_runs_each_round_app_as_its_command_line_reads_on_inputs_it_writes(tmp_path):
    """The quick start's install runs each round app once (``_round_apps``), and a saved model's commands
    (``_saved_model``): every command line is one the CLI takes, and every input it names is written."""
    from paramserver.cli.main import build_parser

    prewarm = _prewarm()
    paths = prewarm._round_inputs(str(tmp_path))
    assert all(os.path.getsize(p) > 0 for p in paths.values())
    for words in prewarm.ROUND_COMMANDS:
        args = build_parser(words[0]).parse_args([paths.get(w, w) for w in words])
        assert args.command == words[0] and args.data in paths.values()
    for words in prewarm.MODEL_COMMANDS:  # a saved model's: read from the folder the first one writes
        assert build_parser(words[0]).parse_args(words).command == words[0]


# ---- 20: why a scheduler does not answer a node with keys ----------------------------------------------
@pytest.fixture()
def curve_server():
    """A CurveZMQ ROUTER and a plain one on 127.0.0.1 (no ZAP handler: any client key passes)."""
    import zmq

    ctx = zmq.Context()
    public, secret = zmq.curve_keypair()
    curve, plain = ctx.socket(zmq.ROUTER), ctx.socket(zmq.ROUTER)
    curve.curve_server, curve.curve_secretkey = True, secret
    addresses = [f"tcp://127.0.0.1:{s.bind_to_random_port('tcp://127.0.0.1')}" for s in (curve, plain)]
    yield public, *addresses
    ctx.destroy(linger=0)


def test_a_handshake_apart_tells_a_refused_key_from_no_keys_and_from_nothing_there(curve_server):
    import time

    import zmq

    from paramserver.wire.handshake import OK, PLAIN, REFUSED, UNKNOWN, handshake
    from paramserver.wire.security import Keys

    server_public, curve, plain = curve_server
    ours = Keys("driver", server_public, *zmq.curve_keypair())
    other = Keys("driver", zmq.curve_keypair()[0], *zmq.curve_keypair())  # another cluster's server key
    started = time.monotonic()
    assert handshake(curve, ours) == OK
    assert handshake(curve, other) == REFUSED
    assert handshake(plain, ours) == PLAIN
    assert time.monotonic() - started < 6.0  # verdicts in milliseconds (a refusal settles in SETTLE_S at most)
    assert handshake("tcp://127.0.0.1:1", ours, timeout_s=0.3) == UNKNOWN
    assert handshake("inproc://x", ours) == UNKNOWN


def test_a_link_closed_without_detail_is_settled_by_a_link_without_keys(curve_server, monkeypatch):
    """ZeroMQ may close a CurveZMQ link to a keyless peer with no detail (the mechanism's error
    not reported, under load for more than 2 s): a second link without keys then tells a
    keyless cluster (its handshake succeeds) from one that refused the key (it fails)."""
    import zmq

    from paramserver.wire import handshake as hs
    from paramserver.wire.security import Keys

    server_public, curve, plain = curve_server
    real, calls = hs._verdict, []

    def closed_first(monitor, deadline):
        calls.append(1)
        return hs._CLOSED if len(calls) % 2 == 1 else real(monitor, deadline)

    monkeypatch.setattr(hs, "_verdict", closed_first)
    other = Keys("driver", zmq.curve_keypair()[0], *zmq.curve_keypair())
    assert hs.handshake(plain, other) == hs.PLAIN
    assert hs.handshake(curve, other) == hs.REFUSED
    assert len(calls) == 4  # each: the keyed link, then one without keys


def test_an_unanswered_node_without_keys_is_told_what_it_was_before():
    from paramserver.wire.handshake import unanswered

    assert unanswered("tcp://h:1", None, "driver", 30, listening=False) == (
        "driver could not reach the scheduler at tcp://h:1 within 30 s: is it running, and is the address right? "
        "(--scheduler / PARAMSERVER_SCHEDULER)")
    assert "give --secret-file FILE" in unanswered("tcp://h:1", None, "worker", 30, listening=True)


def test_an_optimizer_parameter_given_twice_is_refused():
    from paramserver.tables.optim import parse_text

    with pytest.raises(ConfigError, match=r"alpha is given twice in 'ftrl:alpha=0.1,alpha=0.2': give each"):
        parse_text("ftrl:alpha=0.1,alpha=0.2")
    assert parse_text("ftrl:alpha=0.1,l1=1") == {"name": "ftrl", "alpha": 0.1, "l1": 1.0}


# ---- a size flag's bad value: the rule, not "invalid <lambda> value" or a traceback ------------------
@pytest.mark.parametrize("argv, said", [
    (["train", "--data", "x", "--table-memory", "-1"], "argument --table-memory: must be a size in bytes like 512M"),
    (["server", "--table-memory", "lots"], "argument --table-memory: must be a size in bytes like 512M"),
])
def test_a_size_flags_bad_value_is_refused_with_its_rule(argv, said, capsys):
    """--table-memory -1 was 'invalid <lambda> value'."""
    from paramserver.cli.main import build_parser

    with pytest.raises(SystemExit):
        build_parser(argv[0]).parse_args(argv)
    err = capsys.readouterr().err
    assert said in err and "<lambda>" not in err, err


@pytest.mark.parametrize("mb", [math.nan, math.inf, -1.0, 0.0, 1e-9])
def test_shard_mb_must_be_a_finite_size_of_a_byte_or_more(mb):
    """--shard-mb nan crashed train with 'cannot convert float NaN to integer', inf overflowed."""
    from paramserver.data.reader import shard_bytes

    with pytest.raises(ConfigError, match=r"--shard-mb must be > 0 .* at least one byte, like 16 or 0.5; got"):
        shard_bytes(mb)
    assert shard_bytes(0.5) == 1 << 19
