"""One pass at DEFAULT flags on the real data sets, against Vowpal Wabbit in the same run.

Run: ``.venv/bin/python bench/quality.py [--json] [--sets a9a w8a mushrooms criteo avazu]``
(needs ``.[bench]`` and ``../shared/data``).

Every set is trained with ``paramserver train --format F --data TRAIN --test TEST`` and no
other flag (1 server, 1 worker: deterministic), for ``--model lr`` and ``--model fm``, and
with VW 9 one pass, ``--loss_function logistic -b 24``, on the same rows:

* a9a → a9a.t; w8a and mushrooms: 4 of every 5 lines → every 5th line (lines 5, 10, …);
* the Criteo sample: ``criteo_kaggle_wideresdnn_train`` → its ``dev`` and ``test`` files.  VW
  reads two conversions: ``tokens`` (the features paramserver makes: integer buckets
  ⌊ln(v)²⌋ and categorical values, a namespace per field) and ``raw`` (integers as
  numeric features ``I1:v``, categorical values as tokens);
* Avazu: ``avazu_wideresdnn_train`` → ``test``; VW reads ``column=value`` tokens of every
  column but ``id`` and ``click``.

Printed: test log loss and AUC of each learner, and whether paramserver's are ≤ VW's log
loss and ≥ VW's AUC − 0.005 (the bar of issue 11).  The wall time of each command is shown
too, start-up included (these sets are small: it is mostly start-up).
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

from paramserver.apps.ctr.models import auc, logloss

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "data")
PS = [sys.executable, "-m", "paramserver"]


def _lines(path: str) -> list[str]:
    with gzip.open(path, "rt") as f:
        return f.readlines()


def _write(path: str, lines: list[str]) -> str:
    with open(path, "w") as f:
        f.writelines(lines)
    return path


def _libsvm_vw(line: str) -> str:
    label, *feats = line.split()
    return f"{1 if float(label) > 0 else -1} | {' '.join(feats)}\n"


def _criteo_vw(line: str, raw: bool) -> str:
    parts = line.rstrip("\n").split("\t")
    tokens = []
    for f in range(1, 14):
        if parts[f]:
            v = int(parts[f])
            if raw:
                tokens.append(f"I{f}:{v}")
            else:
                tokens.append(f"i{f}_{v if v <= 2 else int(math.log(v) ** 2) + 16}")
    tokens += [f"c{f}_{parts[f] or 'm'}" for f in range(14, 40)]
    return f"{1 if parts[0] == '1' else -1} |f {' '.join(tokens)}\n"


def _avazu_vw(line: str, header: list[str]) -> str:
    parts = line.rstrip("\r\n").split(",")
    tokens = [f"{h}={v}" for h, v in zip(header, parts) if h not in ("id", "click")]
    return f"{1 if parts[header.index('click')] == '1' else -1} |f {' '.join(tokens)}\n"


def prepare(tmp: str, sets: list[str]) -> dict[str, dict]:
    """Train/test files for each set, in paramserver's format and in VW's."""
    out: dict[str, dict] = {}
    lib = os.path.join(DATA, "libsvm")
    for name in sets:
        if name in ("a9a", "w8a", "mushrooms"):
            if name == "a9a":
                tr, te = _lines(f"{lib}/a9a.libsvm.gz"), _lines(f"{lib}/a9a.t.libsvm.gz")
            else:
                rows = _lines(f"{lib}/{name}.libsvm.gz")
                tr = [x for i, x in enumerate(rows) if i % 5 != 4]
                te = [x for i, x in enumerate(rows) if i % 5 == 4]
            if name == "mushrooms":  # labels 1/2: VW's positive class is 2, as paramserver's
                to_vw = lambda x: f"{1 if x.split()[0] == '2' else -1} | {' '.join(x.split()[1:])}\n"  # noqa: E731
            else:
                to_vw = _libsvm_vw
            out[name] = {"format": "libsvm", "train": _write(f"{tmp}/{name}.train", tr),
                         "test": _write(f"{tmp}/{name}.test", te),
                         "vw": {"": (_write(f"{tmp}/{name}.train.vw", [to_vw(x) for x in tr]),
                                     _write(f"{tmp}/{name}.test.vw", [to_vw(x) for x in te]))}}
        elif name == "criteo":
            c = os.path.join(DATA, "criteo")
            tr = _lines(f"{c}/criteo_kaggle_wideresdnn_train.tsv.gz")
            te = (_lines(f"{c}/criteo_kaggle_wideresdnn_dev.tsv.gz")
                  + _lines(f"{c}/criteo_kaggle_wideresdnn_test.tsv.gz"))
            vw = {}
            for conv in ("tokens", "raw"):
                vw[conv] = (_write(f"{tmp}/criteo.train.{conv}.vw", [_criteo_vw(x, conv == "raw") for x in tr]),
                            _write(f"{tmp}/criteo.test.{conv}.vw", [_criteo_vw(x, conv == "raw") for x in te]))
            out[name] = {"format": "criteo", "train": _write(f"{tmp}/criteo.train", tr),
                         "test": _write(f"{tmp}/criteo.test", te), "vw": vw}
        elif name == "avazu":
            a = os.path.join(DATA, "avazu")
            tr, te = _lines(f"{a}/avazu_wideresdnn_train.csv.gz"), _lines(f"{a}/avazu_wideresdnn_test.csv.gz")
            header = tr[0].strip().split(",")
            te = te[1:] if "click" in te[0] else te  # the test file has no header
            out[name] = {"format": "avazu", "train": _write(f"{tmp}/avazu.train.csv", tr),
                         "test": _write(f"{tmp}/avazu.test.csv", te),
                         "vw": {"": (_write(f"{tmp}/avazu.train.vw", [_avazu_vw(x, header) for x in tr[1:]]),
                                     _write(f"{tmp}/avazu.test.vw", [_avazu_vw(x, header) for x in te]))}}
    return out


def run_paramserver(s: dict, model: str, tmp: str) -> dict:
    report = os.path.join(tmp, "report.json")
    cmd = PS + ["train", "--quiet", "--model", model, "--format", s["format"], "--data", s["train"],
                "--test", s["test"], "--metrics-out", report]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if done.returncode:
        return {"error": done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}"}
    with open(report) as f:
        r = json.load(f)
    return {"logloss": r["logloss"], "auc": r["auc"], "wall_s": wall}


def run_vw(train_vw: str, test_vw: str, tmp: str) -> dict:
    from vowpalwabbit import Workspace

    model, preds = os.path.join(tmp, "vw.model"), os.path.join(tmp, "vw.preds")
    t0 = time.perf_counter()
    Workspace(f"--quiet --loss_function logistic -b 24 -d {train_vw} -f {model}").finish()
    Workspace(f"--quiet -t -i {model} -d {test_vw} -p {preds} --link logistic").finish()
    wall = time.perf_counter() - t0
    p = np.loadtxt(preds)
    with open(test_vw) as f:
        y = np.array([1.0 if line.split(None, 1)[0] == "1" else 0.0 for line in f])
    return {"logloss": logloss(y, p), "auc": auc(y, p), "wall_s": wall}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sets", nargs="+", default=["a9a", "w8a", "mushrooms", "criteo", "avazu"])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if not os.path.isdir(DATA):
        sys.exit(f"bench/quality.py: the real data sets are not at {DATA} (../shared/data); nothing to run")
    rows = []
    with tempfile.TemporaryDirectory(prefix="paramserver-quality-") as tmp:
        for name, s in prepare(tmp, args.sets).items():
            vws = {conv: run_vw(*files, tmp) for conv, files in s["vw"].items()}
            for conv, v in vws.items():
                rows.append({"set": name, "learner": f"vw {conv}".strip(), **v})
            for model in ("lr", "fm"):
                r = run_paramserver(s, model, tmp)
                row = {"set": name, "learner": f"paramserver {model}", **r}
                if "logloss" in r:
                    row["meets_every_vw"] = all(r["logloss"] <= v["logloss"] and r["auc"] >= v["auc"] - 0.005
                                                for v in vws.values())
                rows.append(row)
                print(row, file=sys.stderr)
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    print(f"{'set':<10} {'learner':<16} {'test logloss':>12} {'AUC':>7} {'wall s':>7}  ≤ VW (every conversion)")
    for r in rows:
        if "error" in r:
            print(f"{r['set']:<10} {r['learner']:<16} error: {r['error']}")
            continue
        meets = {True: "yes", False: "NO"}.get(r.get("meets_every_vw"), "")
        print(f"{r['set']:<10} {r['learner']:<16} {r['logloss']:>12.4f} {r['auc']:>7.4f} {r['wall_s']:>7.2f}  {meets}")


if __name__ == "__main__":
    main()
