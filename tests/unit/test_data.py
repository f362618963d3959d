"""Parsers and the shard reader: every line once, bad lines named, labels mapped."""

import gzip
import math
from dataclasses import replace

import numpy as np
import pytest

from paramserver.data import parse
from paramserver.data.reader import (
    DataError,
    DataFormat,
    Shard,
    make_shards,
    read_all,
    read_batches,
    sniff_label_format,
    sniff_unlabeled,
)

CRITEO_LINE = "1\t5\t\t-2\t0\t1382\t4\t15\t2\t181\t1\t2\t\t2\t" + "\t".join(
    ["68fd1e64", "80e26c9b", ""] + [f"{i:08x}" for i in range(23)]) + "\n"


def write(path, text, gz=False):
    data = text.encode()
    if gz:
        with gzip.open(path, "wb") as f:
            f.write(data)
    else:
        path.write_bytes(data)
    return str(path)


def test_criteo_line_gives_bias_plus_39_field_keys(tmp_path):
    path = write(tmp_path / "a.tsv", CRITEO_LINE * 3)
    batch = read_all([path], DataFormat("criteo"))
    assert batch.labels.tolist() == [1, 1, 1]
    assert batch.indptr.tolist() == [0, 40, 80, 120]
    row = batch.keys[:40]
    assert len(set(row.tolist())) == 40  # every field its own namespace, missing included
    np.testing.assert_array_equal(batch.keys[:40], batch.keys[40:80])
    # the same token in another field is another key
    moved = CRITEO_LINE.replace("68fd1e64\t80e26c9b", "80e26c9b\t68fd1e64")
    other = read_all([write(tmp_path / "b.tsv", moved)], DataFormat("criteo")).keys
    assert other[14] != row[14] and other[14] != row[15]


def test_integer_buckets_are_log_squared():
    assert parse.bucket_int(0) != parse.bucket_int(1) != parse.bucket_int(2)
    assert parse.bucket_int(100) == parse.bucket_int(99)  # floor(ln(v)^2) = 21 for both
    assert parse.bucket_int(3) != parse.bucket_int(100)
    assert parse.bucket_int(-1) != parse.bucket_int(1)
    # small values read a precomputed table: the same buckets as the formula, either side of it
    values = [-5, -1, 0, 1, 2, 3, 99, 4095, 4096, 4097, 10**6, 10**12]
    assert [parse.bucket_int(v) for v in values] == [parse._bucket_int(v) for v in values]
    assert parse._BUCKETS[4095] == int(math.log(4095) ** 2) + 16


@pytest.mark.parametrize("bad,what", [
    ("2\t" + CRITEO_LINE[2:], "label"),
    (CRITEO_LINE.replace("\t1382\t", "\t13x2\t"), "integer"),
    (CRITEO_LINE.rstrip("\n") + "\textra\n", "40 tab-separated"),
    ("0\t1\t2\n", "40 tab-separated"),
])
def test_a_malformed_criteo_line_names_file_line_and_text(tmp_path, bad, what):
    path = write(tmp_path / "bad.tsv", CRITEO_LINE * 4 + bad + CRITEO_LINE)
    with pytest.raises(DataError, match=rf"bad.tsv:5: .*{what}") as err:
        read_all([path], DataFormat("criteo"))
    assert repr(bad.strip()[:20])[1:-1] in str(err.value) and "--skip-bad-lines" in str(err.value)
    stats = {}
    batches = list(read_batches(Shard(path, 0, -1), DataFormat("criteo", skip_bad=True), 100, stats))
    assert sum(len(b) for b in batches) == 5 and stats["bad_lines"] == 1


@pytest.mark.parametrize("fmt,labels", [("01", "0 1 1 0"), ("pm1", "-1 +1 1 -1"), ("12", "1 2 2 1")])
def test_libsvm_labels_are_mapped_to_0_1(tmp_path, fmt, labels):
    text = "".join(f"{lab} 3:1 10:0.5 \n" for lab in labels.split())
    batch = read_all([write(tmp_path / "a.svm", text)], DataFormat("libsvm", label_format=fmt))
    assert batch.labels.tolist() == [0, 1, 1, 0]
    assert batch.indptr.tolist() == [0, 3, 6, 9, 12]
    assert batch.vals[:3].tolist() == [1.0, 1.0, 0.5]  # bias, 3:1, 10:0.5


@pytest.mark.parametrize("line,what", [("1 -1:1\n", "whole number from 0 to"), ("1 3\n", "index:value"),
                                       ("1 3:1 qid:2\n", "whole number from 0 to"), ("1 x:1 # 3:1\n", "whole number"),
                                       ("1 3:abc\n", "finite number"), ("7 3:1\n", "label")])
def test_bad_libsvm_lines(tmp_path, line, what):
    path = write(tmp_path / "a.svm", "1 2:1\n" + line)
    with pytest.raises(DataError, match=rf"a.svm:2: .*{what}"):
        read_all([path], DataFormat("libsvm", label_format="01"))


def test_libsvm_reads_svmlight_comments_query_ids_and_index_zero(tmp_path):
    """svmlight's syntax, which LIBSVM files from other tools carry: ``#`` comments (a line of
    one, or a line's tail), ``qid:`` after the label, and 0-based indices (scikit-learn's
    ``dump_svmlight_file`` writes them by default): the same rows as the plain file's."""
    plain = write(tmp_path / "plain.svm", "1 3:1 10:0.5\n0 0:2\n1 7:1\n")
    fancy = write(tmp_path / "fancy.svm", "# written by a tool\n#\n1 qid:4 3:1 10:0.5 # a note\n"
                                          "0 qid:4 0:2\n  # indented\n1 7:1#tight\n")
    a, b = (read_all([p], DataFormat("libsvm", label_format="01")) for p in (plain, fancy))
    assert b.labels.tolist() == [1, 0, 1]
    np.testing.assert_array_equal(a.indptr, b.indptr)
    np.testing.assert_array_equal(a.keys, b.keys)
    np.testing.assert_array_equal(a.vals, b.vals)
    assert len(set(a.keys.tolist())) == 5  # 0:2 is a feature of its own (bias, 3, 10, 0, 7)
    assert sniff_label_format(fancy) == "01"
    assert not sniff_unlabeled(fancy, DataFormat("libsvm"))
    unlabeled = write(tmp_path / "u.svm", "# rows to score\n3:1 10:0.5\n")
    assert sniff_unlabeled(unlabeled, DataFormat("libsvm"))


def test_byte_range_shards_cover_every_line_exactly_once(tmp_path):
    lines = [CRITEO_LINE.replace("\t5\t", f"\t{i}\t", 1) for i in range(997)]
    path = write(tmp_path / "big.tsv", "".join(lines))
    whole = read_all([path], DataFormat("criteo")).keys.reshape(-1, 40)
    for shard_bytes in (1000, 4096, 77_777):
        shards = make_shards([path], shard_bytes)
        assert len(shards) > 1
        parts = [b.keys.reshape(-1, 40) for s in shards for b in read_batches(s, DataFormat("criteo"), 64)]
        got = np.concatenate(parts)
        np.testing.assert_array_equal(got, whole)  # same lines, same order, none twice


def test_gzip_is_one_shard_and_reads_the_same(tmp_path):
    plain = write(tmp_path / "a.tsv", CRITEO_LINE * 50)
    packed = write(tmp_path / "a.tsv.gz", CRITEO_LINE * 50, gz=True)
    assert make_shards([packed], 10) == [Shard(packed, 0, -1)]
    np.testing.assert_array_equal(read_all([packed], DataFormat()).keys, read_all([plain], DataFormat()).keys)


def test_missing_and_empty_inputs_are_clear(tmp_path):
    with pytest.raises(DataError, match="no such file: .*nope.tsv"):
        make_shards([str(tmp_path / "nope.tsv")])
    (tmp_path / "empty.tsv").write_bytes(b"")
    with pytest.raises(DataError, match="is empty"):
        make_shards([str(tmp_path / "empty.tsv")])


def test_hash_bits_fold_keys():
    buf = np.frombuffer(CRITEO_LINE.encode(), np.uint8)
    keys = np.empty((1, 40), np.uint64)
    parse.parse_criteo(buf, 1, False, np.uint64((1 << 18) - 1), np.empty(1, np.float32), keys,
                       np.empty(1, np.int64))
    assert keys.max() < 1 << 18


def _reference_criteo(text: bytes, mask):
    """The Criteo rules in plain Python: what ``parse_criteo`` must return, line by line:
    ``(ERR_NONE, label, keys, offset past the line)`` or ``(error, offset of the line)``."""
    def fnv(token):
        h = 0xCBF29CE484222325
        for byte in token:
            h = ((h ^ byte) * 0x100000001B3) % 2**64
        return h

    def integer(token):
        digits = token[1:] if token[:1] in (b"-", b"+") else token
        if not digits or len(digits) > 18 or not all(48 <= c <= 57 for c in digits):
            return None
        return -int(digits) if token[:1] == b"-" else int(digits)

    rows, pos = [], 0
    for line in text.split(b"\n")[:-1]:
        start, pos = pos, pos + len(line) + 1
        line = line[:-1] if line.endswith(b"\r") else line
        if not line:
            continue
        fields = line.split(b"\t")
        if fields[0] not in (b"0", b"1") or len(fields) == 1:
            rows.append((parse.ERR_LABEL, start))
            continue
        keys, err = [parse.feature_key(0, np.uint64(0), mask)], parse.ERR_NONE
        for field, token in enumerate(fields[1:40], 1):  # the first wrong field decides the error
            if (field == len(fields) - 1) != (field == 39):  # the line ends early, or goes on
                err = parse.ERR_FIELDS
                break
            if not token:
                value = 0xFFFFFFFFFFFFFFF1
            elif field <= 13:
                v = integer(token)
                if v is None:
                    err = parse.ERR_INT
                    break
                value = parse._bucket_int.py_func(v)
            else:
                value = fnv(token)
            keys.append(parse.feature_key(field, np.uint64(value), mask))
        rows.append((err, float(fields[0] == b"1"), keys, pos) if not err else (err, start))
    return rows


def test_criteo_parser_matches_the_rules_on_odd_lines():
    """The parser reads 8 bytes at a time; every odd shape of field, at every distance
    from the buffer's end, must still parse (or fail) exactly as the rules say."""
    rng = np.random.default_rng(7)
    ints = ["", "0", "7", "42", "1382", "999999", "1234567", "12345678", "123456789012", "-1", "+3",
            "0" * 18]
    bad_ints = ["-", "1x", "/5", ":5", "5:", "\u0661", "9" * 19, "1\r2"]
    cats = ["", "68fd1e64", "0a", "abcdef0", "abcdef012", "\xff\xfe", "a\rb", "12345678" * 3]

    def pick(choices, bad=(), p_bad=0.0):
        return str(rng.choice(bad if rng.random() < p_bad else choices))

    def line():  # most lines good, one in ~6 wrong somewhere
        if rng.random() < 0.02:
            return pick(["1\n", "0\t\n", "1\t2\r\n", "\r\n", "\r\r\n"])
        fields = [pick(["0", "1"], ["2", "", "01"], 0.03)]
        fields += [pick(ints, bad_ints, 0.005) for _ in range(13)] + [pick(cats) for _ in range(26)]
        if rng.random() < 0.03:
            del fields[rng.integers(1, 40)]
        if rng.random() < 0.03:
            fields.insert(rng.integers(1, 40), "3")
        return "\t".join(fields) + pick(["\n", "\r\n"]) + ("\n" if rng.random() < 0.03 else "")

    mask, lines = np.uint64((1 << 20) - 1), {"good": 0, "bad": 0}
    for _ in range(500):
        text = "".join(line() for _ in range(rng.integers(1, 6))).encode()
        buf = np.frombuffer(text, np.uint8)
        want = _reference_criteo(text, mask)
        good = [r for r in want if r[0] == parse.ERR_NONE]
        cap = len(want) + 1
        labels, keys, ends = np.empty(cap, np.float32), np.empty((cap, 40), np.uint64), np.empty(cap, np.int64)
        n, used, bad, err, at = parse.parse_criteo(buf, cap, True, mask, labels, keys, ends)
        assert (n, bad, err, used) == (len(good), len(want) - len(good), parse.ERR_NONE, len(text)), text
        assert labels[:n].tolist() == [r[1] for r in good], text
        assert keys[:n].tolist() == [[int(k) for k in r[2]] for r in good], text
        assert ends[:n].tolist() == [r[3] for r in good], text
        lines["good"] += len(good)
        lines["bad"] += len(want) - len(good)
        first_bad = next((i for i, r in enumerate(want) if r[0] != parse.ERR_NONE), None)
        n, used, bad, err, at = parse.parse_criteo(buf, cap, False, mask, labels, keys, ends)
        if first_bad is None:
            assert err == parse.ERR_NONE and n == len(want)
        else:
            assert (n, err, at) == (first_bad, *want[first_bad]), text
    assert lines["good"] > 4 * lines["bad"] > 100  # both kinds, in numbers


@pytest.mark.parametrize("fmt,text", [
    (DataFormat("criteo"), "".join(CRITEO_LINE.replace("\t5\t", f"\t{i}\t", 1) for i in range(40))),
    (DataFormat("libsvm"), "".join(f"{i % 2} " + " ".join(f"{j}:{i}" for j in range(1, 30)) + "\n"
                                   for i in range(40)))])
def test_lines_longer_than_the_read_buffer_and_a_missing_last_newline(tmp_path, monkeypatch, fmt, text):
    path = write(tmp_path / "a.txt", text.rstrip("\n"))
    want = read_all([path], fmt)
    monkeypatch.setattr("paramserver.data.reader.CHUNK_BYTES", 37)  # every line spans reads; the buffer grows
    for batch_size in (1, 3, 40):
        for shard_bytes in (500, 1 << 20):
            stats, got = {}, []
            for shard in make_shards([path], shard_bytes):
                batches = list(read_batches(shard, fmt, batch_size, stats))
                assert all(len(b) == batch_size for b in batches[:-1])  # only a shard's last is short
                got += batches
            assert stats["examples"] == 40
            assert stats["bytes"] == len(text) - 1  # each shard's own bytes, counted once
            for field in ("labels", "keys", "vals"):
                np.testing.assert_array_equal(np.concatenate([getattr(b, field) for b in got]), getattr(want, field))
            np.testing.assert_array_equal(np.concatenate([np.diff(b.indptr) for b in got]), np.diff(want.indptr))


def test_a_truncated_gzip_is_named_in_one_line(tmp_path):
    import gzip as gz
    whole = tmp_path / "whole.svm.gz"
    with gz.open(whole, "wt") as f:
        f.write("".join(f"1 {i % 50 + 1}:1\n" for i in range(50_000)))
    cut = tmp_path / "cut.svm.gz"
    cut.write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])
    with pytest.raises(DataError, match=r"cut.svm.gz: cannot decompress it .* is the file whole"):
        read_all([str(cut)], DataFormat("libsvm"))


@pytest.mark.parametrize("damage", ["truncated", "corrupt"])
def test_a_damaged_compressed_file_is_named_by_every_reader_that_opens_it(tmp_path, damage):
    """The sniffers, a shard's first read and the whole-file readers (lasso, mf, lda,
    split-columns) raised zlib.error or EOFError tracebacks where the shard reader named the file."""
    import gzip as gz

    from paramserver.data.reader import sniff_label_format, sniff_unlabeled
    from paramserver.data.whole import read_whole

    whole = gz.compress("".join(f"1 {i % 50 + 1}:1\n" for i in range(2_000)).encode())  # the sniffers read it all
    bad = whole[: len(whole) // 2] if damage == "truncated" else whole[:10] + b"garbage" * 40
    path = tmp_path / "bad.svm.gz"
    path.write_bytes(bad)
    want = r"bad.svm.gz: cannot decompress it .* is the file whole"
    for read in (lambda: sniff_unlabeled(str(path), DataFormat("libsvm")), lambda: sniff_label_format(str(path)),
                 lambda: read_whole(str(path)), lambda: read_all([str(path)], DataFormat("libsvm"))):
        with pytest.raises(DataError, match=want):
            read()


def test_a_plain_file_named_gz_is_refused_by_name_before_its_first_read(tmp_path):
    """It failed in the worker with 'BadGzipFile: Not a gzipped file' and no file name."""
    plain = tmp_path / "day0.tsv.gz"
    plain.write_bytes(b"1\t5\t\ta1b2\n" * 10)
    with pytest.raises(DataError, match=r"day0.tsv.gz: its name ends in .gz but it starts as b'1\\t5\\t.*', not "
                                        r"gzip data; rename it to what it holds \(without .gz if it is plain text\)"):
        read_all([str(plain)], DataFormat("criteo"))


def test_skip_bad_lines_fails_when_most_lines_are_bad(tmp_path):
    """news20 multiclass with --skip-bad-lines skipped 14 358 of 15 935 lines and exited 0."""
    path = tmp_path / "multi.svm"
    path.write_text("".join(f"{i % 20 + 1} {i % 9 + 1}:1\n" for i in range(2000)))  # labels 1..20
    fmt = DataFormat("libsvm", label_format="01", skip_bad=True)
    with pytest.raises(DataError, match=r"1,900 of the 2,000 lines .* more than --max-bad-fraction 0.01"):
        read_all([str(path)], fmt)
    assert len(read_all([str(path)], replace(fmt, max_bad_fraction=0.96))) == 100  # allowed: skipped, counted


@pytest.mark.parametrize("line", ["0 2:1 2:1", "0 5:1 2:1 5:0.5", "1 7:1 3:2 9:1 3:1"])
def test_a_libsvm_index_twice_in_a_line_is_an_error_or_skipped(tmp_path, line):
    path = tmp_path / "d.svm"
    path.write_text(f"1 1:1 3:1\n{line}\n1 4:1 2:1\n")
    with pytest.raises(DataError, match=r"d.svm:2: a feature index appears twice in the line"):
        read_all([str(path)], DataFormat("libsvm"))
    stats = {}
    got = sum(len(b) for b in read_batches(Shard(str(path), 0, -1), DataFormat("libsvm", skip_bad=True), 10, stats))
    assert got == 2 and stats["bad_lines"] == 1


def test_a_new_checkpoint_removes_the_partial_steps_older_than_the_newest_complete_one(tmp_path):
    """Issue 12, bug 15: interrupted checkpoints were never removed (1.5 GB in 10 runs)."""
    from paramserver.checkpoint import store as checkpoint
    root = tmp_path / "ckpt"
    for step, complete in ((100, False), (200, True), (300, False), (400, True), (500, False)):
        (root / f"{step:015d}" / "t").mkdir(parents=True)
        (root / f"{step:015d}" / "t" / "0.npz").write_bytes(b"x" * 1000)
        if complete:
            (root / f"{step:015d}" / checkpoint.MANIFEST).write_text("{}")
    new = checkpoint.new_step_url(str(root))
    left = sorted(p.name for p in root.iterdir())
    assert left == [f"{s:015d}" for s in (200, 400, 500)]  # 500 may be a checkpoint being written: kept
    assert new > str(root / f"{500:015d}")


def test_prune_keeps_the_newest_complete_steps_and_never_a_step_being_written(tmp_path):
    from paramserver.checkpoint import store as checkpoint
    root = tmp_path / "ckpt"
    for step in (100, 200, 300, 400):
        (root / f"{step:015d}").mkdir(parents=True)
        (root / f"{step:015d}" / checkpoint.MANIFEST).write_text("{}")
    (root / f"{500:015d}").mkdir()  # being written: no manifest yet
    removed = checkpoint.prune(str(root), keep=2)
    assert [p.rsplit("/", 1)[-1] for p in removed] == [f"{100:015d}", f"{200:015d}"]
    assert sorted(p.name for p in root.iterdir()) == [f"{s:015d}" for s in (300, 400, 500)]
    checkpoint.prune(str(root), keep=0)  # 0 and 1 both keep the newest complete step
    assert sorted(p.name for p in root.iterdir()) == [f"{s:015d}" for s in (400, 500)]


def test_local_paths_are_read_without_fsspec_and_may_be_pathlib_paths(tmp_path):
    """Plain local files are sized and opened with os (fsspec is imported for URLs and
    compressed files only), str or pathlib.Path alike; the errors name the path."""
    import pathlib

    from paramserver.apps.ctr.modelfile import check_output
    from paramserver.data.files import is_plain_local, open_input
    from paramserver.errors import ConfigError

    data = tmp_path / "d.tsv"
    data.write_bytes(b"1\t" + b"\t".join([b"1"] * 13 + [b"a1b2c3d4"] * 26) + b"\n")
    for path in (data, str(data)):
        assert is_plain_local(path)
        (shard,) = make_shards([path])
        assert shard.end == -1
        with open_input(path) as f:
            assert f.read(2) == b"1\t"
    assert not is_plain_local(str(data) + ".gz") and not is_plain_local("s3://bucket/d.tsv")
    with pytest.raises(DataError, match="no such file: .*missing.tsv"):
        make_shards([tmp_path / "missing.tsv"])
    (tmp_path / "empty.tsv").write_bytes(b"")
    with pytest.raises(DataError, match="empty.tsv is empty"):
        make_shards([pathlib.Path(tmp_path / "empty.tsv")])
    with pytest.raises(DataError, match="is a directory"):
        make_shards([tmp_path])
    check_output(tmp_path / "out" / "model", "--save", folder=True)  # made, written to, left empty
    assert (tmp_path / "out" / "model").is_dir() and not list((tmp_path / "out" / "model").iterdir())
    with pytest.raises(ConfigError, match="is a file; name a folder"):
        check_output(data, "--save", folder=True)
    with pytest.raises(ConfigError, match="is a folder; name a file"):
        check_output(tmp_path, "--metrics-out", folder=False)


def test_a_file_that_starts_with_a_byte_order_mark_reads_as_without_it(tmp_path):
    """Issue 33.4: a LIBSVM file that starts with a UTF-8 byte-order mark failed on line 1."""
    from paramserver.data.reader import DataFormat, read_all

    lines = "1 3:1 5:1\n0 2:1\n1 3:1 7:1\n"
    plain, marked = tmp_path / "plain.svm", tmp_path / "marked.svm"
    plain.write_text(lines)
    marked.write_bytes(b"\xef\xbb\xbf" + lines.encode())
    a, b = (read_all([str(p)], DataFormat("libsvm")) for p in (plain, marked))
    assert a.labels.tolist() == b.labels.tolist() == [1.0, 0.0, 1.0]
    assert a.keys.tolist() == b.keys.tolist() and a.indptr.tolist() == b.indptr.tolist()


def test_compressed_or_binary_data_under_a_plain_name_is_said_to_be_so(tmp_path):
    """Not 'the label must be 0 or 1' alone: what the bytes are, and the fix."""
    renamed = tmp_path / "day0.tsv"
    renamed.write_bytes(gzip.compress(b"1\t5\t\ta1b2\n0\t3\t\tc3d4\n" * 50))
    with pytest.raises(DataError, match=r"day0.tsv:1: .*the file is gzip data: name it with .gz at the end"):
        read_all([str(renamed)], DataFormat("criteo"))
    binary = tmp_path / "day1.tsv"
    binary.write_bytes(b"\x7fELF\x02\x01\x01\x00" + bytes(200))
    with pytest.raises(DataError, match=r"day1.tsv:1: .*the file holds NUL bytes: it is binary"):
        read_all([str(binary)], DataFormat("criteo"))


def test_a_criteo_batch_knows_its_values_are_ones_through_cuts_and_joins(tmp_path):
    """The Criteo and CSV parsers make batches whose every value is 1 and say so (``ones``):
    a step then sends none without reading them (``values()`` is empty).  A cut keeps it, a
    join keeps it only where every part has it; a LIBSVM batch reads as its values."""
    from paramserver.data.batch import concat_batches, slice_batch

    crit = read_all([write(tmp_path / "a.tsv", CRITEO_LINE * 5)], DataFormat("criteo"))
    assert crit.ones and (crit.vals == 1).all() and crit.values().size == 0
    part = slice_batch(crit, 1, 3)
    assert part.ones and part.values().size == 0 and len(part) == 2
    svm = read_all([write(tmp_path / "b.svm", "1 3:0.5 7:2\n0 1:1\n")], DataFormat("libsvm"))
    assert not svm.ones and svm.values().tolist() == svm.vals.tolist() == [1.0, 0.5, 2.0, 1.0, 1.0]  # bias first
    assert concat_batches([crit, part]).ones
    joined = concat_batches([part, svm])
    assert not joined.ones and joined.values().size == joined.keys.size
    # the empty values are one array, shared: nothing written to it changes it, and nothing can
    # resize it while a batch holds it; writable, as a batch's own values are, so a kernel given
    # either is the one the warm-up compiled (``wire/step_arrays.NO_VALUES``)
    empty = crit.values()
    assert empty is part.values() and empty.flags.writeable
    empty[:] = 2
    assert crit.values().size == 0
    with pytest.raises(ValueError):
        empty.resize(3)


def test_a_criteo_batch_makes_no_values_unless_they_are_read(tmp_path):
    """A parser's all-ones batch holds no values (``held_vals`` None) through cuts and joins of
    such batches: the step path (``values()``) never makes them; reading ``vals`` makes them,
    ones, once.  A join with a batch that holds its values holds them all, in order; a batch
    whose values are unknown cannot leave them out."""
    from paramserver.data.batch import Batch, concat_batches, slice_batch

    crit = read_all([write(tmp_path / "a.tsv", CRITEO_LINE * 5)], DataFormat("criteo"))
    part = slice_batch(crit, 1, 4)
    joined = concat_batches([part, slice_batch(crit, 0, 2)])
    for b in (part, joined):
        assert b.held_vals is None and b.values().size == 0 and b.held_vals is None
    assert joined.vals.dtype == np.float32 and joined.vals.tolist() == [1.0] * joined.keys.size
    assert joined.held_vals is joined.vals  # made once
    svm = read_all([write(tmp_path / "b.svm", "1 3:0.5\n")], DataFormat("libsvm"))
    mixed = concat_batches([part, svm])
    assert not mixed.ones and mixed.vals.tolist() == [1.0] * part.keys.size + [1.0, 0.5]
    with pytest.raises(ValueError, match="ones=True"):
        Batch(svm.labels, svm.indptr, svm.keys, None)


def test_a_utf8_byte_order_mark_is_no_part_of_a_files_first_line(tmp_path):
    """Excel's "CSV UTF-8" and Notepad start a file with one: a CSV's label column was not
    found ('\\ufeffy'), an MF user or LDA word split in two, lasso and split-columns refused
    the file.  Each reader now gives what it gives for the file without it."""
    from paramserver.apps.ctr.vertical import split_columns
    from paramserver.data.whole import read_whole

    bom = b"\xef\xbb\xbf"
    text = b"y,a,num\n1,x,3\n0,z,4\n"
    for name, body, fmt in (("h.csv", text, DataFormat("csv", label_column="y")),
                            ("n.csv", text.split(b"\n", 1)[1], DataFormat("avazu")),  # no header: the first row
                            ("s.svm", b"1 3:1 7:0.5\n0 2:1\n", DataFormat("libsvm"))):
        plain, marked = tmp_path / f"plain-{name}", tmp_path / f"marked-{name}"
        plain.write_bytes(body)
        marked.write_bytes(bom + body)
        if fmt.name != "avazu":
            want, got = read_all([str(plain)], fmt), read_all([str(marked)], fmt)
            for field in ("labels", "keys", "vals", "indptr"):
                np.testing.assert_array_equal(getattr(got, field), getattr(want, field))
        assert read_whole(str(marked))[0] == read_whole(str(plain))[0]
    split_columns(str(tmp_path / "marked-s.svm"), 2, str(tmp_path / "marked"))
    split_columns(str(tmp_path / "plain-s.svm"), 2, str(tmp_path / "plain"))
    for p in range(2):
        block = f"block-{p}.libsvm"
        assert (tmp_path / "marked" / block).read_bytes() == (tmp_path / "plain" / block).read_bytes()


def test_a_reports_nan_and_infinite_figures_are_json_null():
    """eval's AUC on a test set of one class was written as NaN, which JSON parsers refuse."""
    import json

    from paramserver.data.files import report_json

    report = {"auc": math.nan, "logloss": 0.5, "gaps": [1.0, math.inf], "inner": {"x": -math.inf}, "n": 3}
    for indent in (None, 1):
        assert json.loads(report_json(report, indent), parse_constant=lambda c: pytest.fail(c)) == {
            "auc": None, "logloss": 0.5, "gaps": [1.0, None], "inner": {"x": None}, "n": 3}


def test_the_label_encoding_is_the_one_most_lines_have(tmp_path):
    """A stray 2 among 0/1 labels took the file for 1/2: the error then named a good line (a
    0) where the stray line is the one to fix or skip."""
    for labels, want in (([1, 0, 0, 2, 1], "01"), ([1, -1, -1, 0, 1], "pm1"), ([2, 1, 2, 0], "12"), ([1, 1], "01"),
                         ([-1, 1], "pm1"), ([0, -1], "01")):
        path = write(tmp_path / "l.svm", "".join(f"{y} 3:1\n" for y in labels))
        assert sniff_label_format(path) == want, labels
    path = write(tmp_path / "stray.svm", "1 3:1\n0 2:1\n0 4:1\n2 5:1\n")
    with pytest.raises(DataError, match=r"stray.svm:4: the label must be 0 or 1 .*'2 5:1'"):
        read_all([path], DataFormat("libsvm", label_format=sniff_label_format(path)))
