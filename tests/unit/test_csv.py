"""CSV and Avazu input: a header names the fields, values are hashed per column name,
bad lines are named by file and line."""

import gzip

import numpy as np
import pytest

from paramserver.data import csv
from paramserver.data.reader import DataError, DataFormat, Shard, make_shards, read_all, read_batches
from paramserver.errors import ConfigError

HEADER = "id,click,hour,site,device\n"


def _write(path, text, gz=False):
    opener = gzip.open if gz else open
    with opener(path, "wt") as f:
        f.write(text)
    return str(path)


def _reference_keys(header, line, label, ignore=(), hour="", mask=0):
    """The keys of one line, computed in plain Python from the documented rules."""
    from paramserver.data.parse import feature_key
    names = header.strip().split(",")
    values = line.rstrip("\r\n").split(",")
    golden, m64 = 0x9E3779B97F4A7C15, (1 << 64) - 1

    def fmix(k):
        k ^= k >> 33
        k = (k * 0xFF51AFD7ED558CCD) & m64
        k ^= k >> 33
        k = (k * 0xC4CEB9FE1A85EC53) & m64
        return k ^ (k >> 33)

    def fnv(data):
        h = 0xCBF29CE484222325
        for b in data:
            h = ((h ^ b) * 0x100000001B3) & m64
        return h

    def key(ns, token):
        k = fmix(token ^ ((ns * golden) & m64))
        return k & mask if mask else k

    missing = 0xFFFFFFFFFFFFFFF1
    out = [int(feature_key(0, np.uint64(0), np.uint64(mask)))]
    for name, value in zip(names, values):
        if name == label or name in ignore:
            continue
        ns = fnv(name.encode())
        if name == hour:
            import datetime
            day = datetime.date(2000 + int(value[:2]), int(value[2:4]), int(value[4:6]))
            out += [key(ns, int(value[6:])), key(ns ^ 1, (day.weekday() + 0) % 7)]
        else:
            out.append(key(ns, missing if value == "" else fnv(value.encode())))
    return out


def test_csv_rows_match_a_plain_python_reference(tmp_path):
    lines = ["1,0,14102100,a1,phone\n", "2,1,14102213,,tablet\r\n", "3,0,14103023,b2,\n"]
    path = _write(tmp_path / "x.csv", HEADER + "".join(lines))
    batch = read_all([path], DataFormat("csv", hash_bits=0, label_column="click", ignore_columns=("id",)))
    assert batch.labels.tolist() == [0, 1, 0]
    k = batch.indptr[1]
    for i, line in enumerate(lines):
        want = _reference_keys(HEADER, line, "click", ignore=("id",))
        assert batch.keys[i * k:(i + 1) * k].tolist() == want


def test_eight_character_tokens_and_rows_of_more_than_64_keys_match_the_reference(tmp_path):
    """8-character tokens are hashed from the word in a pass of their own (``_finish_row``):
    the same keys as every other length's, in the first 64 keys of a row and past them."""
    names = ["click", *[f"c{i}" for i in range(70)]]
    header = ",".join(names) + "\n"
    rng = np.random.default_rng(5)
    lines = []
    for label in (0, 1, 1):
        values = [str(label)]
        for _ in range(70):
            width = (7, 8, 8, 9, 0, 8, 1)[int(rng.integers(0, 7))]
            values.append("".join(rng.choice(list("0123456789abcdef"), width)))
        lines.append(",".join(values) + "\n")
    path = _write(tmp_path / "wide.csv", header + "".join(lines))
    for mask in (0, (1 << 24) - 1):
        batch = read_all([path], DataFormat("csv", hash_bits=24 if mask else 0, label_column="click"))
        k = batch.indptr[1]
        assert k == 71
        for i, line in enumerate(lines):
            assert batch.keys[i * k:(i + 1) * k].tolist() == _reference_keys(header, line, "click", mask=mask)


def test_avazu_splits_hour_into_hour_of_day_and_weekday(tmp_path):
    lines = ["1,0,14102100,a1,phone\n", "2,1,14102213,x,tablet\n"]
    path = _write(tmp_path / "a.csv", HEADER + "".join(lines))
    batch = read_all([path], DataFormat("avazu"))  # the default --hash-bits 24 folds the keys
    k = batch.indptr[1]
    assert k == 1 + 2 + 2  # bias, hour of day + weekday, site, device
    for i, line in enumerate(lines):
        assert batch.keys[i * k:(i + 1) * k].tolist() == _reference_keys(HEADER, line, "click", ("id",), "hour",
                                                                         mask=(1 << 24) - 1)


def test_weekday_is_the_calendar_weekday():
    import datetime
    for y, m, d in [(2014, 10, 21), (2000, 2, 29), (2016, 3, 1), (2099, 12, 31)]:
        assert csv._weekday(y, m, d) == datetime.date(y, m, d).weekday()


def test_column_order_does_not_change_the_keys(tmp_path):
    a = _write(tmp_path / "a.csv", "click,site,device\n1,s1,d1\n")
    b = _write(tmp_path / "b.csv", "device,click,site\nd1,1,s1\n")
    fmt = DataFormat("csv", label_column="click")
    assert sorted(read_all([a], fmt).keys.tolist()) == sorted(read_all([b], fmt).keys.tolist())


def test_avazu_without_a_header_has_avazu_columns(tmp_path):
    row = "1000009418151094273,0,14102100,1005,0,1fbe01fe,f3845767,28905ebd,ecad2386,7801e8d9,07d7df22,a99f214a," \
          "ddd2926e,44956a24,1,2,15706,320,50,1722,0,35,-1,79\n"
    with_header = _write(tmp_path / "h.csv", ",".join(csv.AVAZU_COLUMNS) + "\n" + row)
    without = _write(tmp_path / "n.csv.gz", row, gz=True)
    a, b = read_all([with_header], DataFormat("avazu")), read_all([without], DataFormat("avazu"))
    assert len(a) == len(b) == 1 and a.keys.tolist() == b.keys.tolist()


def test_a_shard_that_starts_mid_file_reads_the_header(tmp_path):
    rows = "".join(f"{i},{i % 2},14102100,s{i % 7},d{i % 3}\n" for i in range(3000))
    path = _write(tmp_path / "big.csv", HEADER + rows)
    fmt = DataFormat("csv", label_column="click", ignore_columns=("id",))
    whole = read_all([path], fmt)
    shards = make_shards([path], shard_bytes=10_000)
    assert len(shards) > 3
    parts = [b for s in shards for b in read_batches(s, fmt, 500)]
    assert sum(len(b) for b in parts) == 3000
    assert np.concatenate([b.keys for b in parts]).tolist() == whole.keys.tolist()


@pytest.mark.parametrize("body,match", [
    ('1,0,14102100,"a,b",d\n', r"x.csv:2: a quoted field"),
    ("1,0,14102100,a\n", r"x.csv:2: expected 5 comma-separated fields, as the header has"),
    ("1,0,14102100,a,b,c\n", r"x.csv:2: expected 5 comma-separated fields"),
    ("1,0,14102100,a,b\n2,yes,14102100,a,b\n", r"x.csv:3: the label \(column 'click'\) must be 0 or 1"),
])
def test_bad_lines_name_the_file_the_line_and_the_rule(tmp_path, body, match):
    path = _write(tmp_path / "x.csv", HEADER + body)
    with pytest.raises(DataError, match=match):
        read_all([path], DataFormat("csv", label_column="click"))


def test_bad_lines_can_be_skipped_and_counted(tmp_path):
    path = _write(tmp_path / "x.csv", HEADER + '1,0,1,a,b\n2,0,1,"q",b\n3,1,1,c\n4,1,1,d,e')  # no last newline
    stats = {}
    batches = list(read_batches(Shard(path, 0, -1), DataFormat("csv", label_column="click", skip_bad=True), 10,
                                stats))
    assert sum(len(b) for b in batches) == 2 and stats["bad_lines"] == 2


@pytest.mark.parametrize("fmt,header,match", [
    (DataFormat("csv"), HEADER, "--format csv needs --label COLUMN"),
    (DataFormat("csv", label_column="clicked"), HEADER, "no column 'clicked' for the label"),
    (DataFormat("csv", label_column="click", ignore_columns=("nope",)), HEADER, "--ignore-columns nope: not in"),
    (DataFormat("csv", label_column="click"), "click,a,a\n", "names columns more than once"),
    (DataFormat("avazu"), "a,b,c\n", "no column 'click'"),
])
def test_header_problems_are_one_line(tmp_path, fmt, header, match):
    path = _write(tmp_path / "x.csv", header + "1,2,3\n")
    with pytest.raises(ConfigError, match=match):
        read_all([path], fmt)


def test_numeric_columns_are_bucketed_by_size_as_criteos_integers(tmp_path):
    """17 and 18 share a key (as Criteo's integers do), 17 and 1700 do not; a fraction is
    bucketed by log size and sign; an empty value is the column's missing token; the
    column hashed as a string (no flag) gives every value a key of its own."""
    header = "click,price,site\n"
    rows = ["1,17,a\n", "0,18,a\n", "1,1700,a\n", "0,0.25,a\n", "1,-0.25,a\n", "0,,a\n", "1,0.26,a\n"]
    path = _write(tmp_path / "n.csv", header + "".join(rows))
    fmt = DataFormat("csv", hash_bits=0, label_column="click", numeric_columns=("price",))
    batch = read_all([path], fmt)
    price = batch.keys.reshape(len(rows), 3)[:, 1].tolist()  # bias, price, site
    assert price[0] == price[1] != price[2]  # 17 ~ 18, not 1700
    assert price[3] != price[4] and price[3] == price[6]  # sign kept; 0.25 ~ 0.26
    assert len(set(price)) == 5
    plain = read_all([path], DataFormat("csv", hash_bits=0, label_column="click")).keys.reshape(len(rows), 3)
    assert len(set(plain[:, 1].tolist())) == 7
    from paramserver.data.csv import numeric_bucket
    from paramserver.data.parse import bucket_int
    assert numeric_bucket(17.0) == bucket_int(17) and numeric_bucket(2.0) == bucket_int(2)


def test_numeric_columns_are_checked(tmp_path):
    path = _write(tmp_path / "n.csv", "click,price\n1,12\n0,cheap\n")
    with pytest.raises(DataError, match=r"n.csv:3: a value of a numeric column \(price: --numeric-columns\) is not a "
                                        "number"):
        read_all([path], DataFormat("csv", label_column="click", numeric_columns=("price",)))
    with pytest.raises(ConfigError, match="--numeric-columns cost: not in the header"):
        read_all([path], DataFormat("csv", label_column="click", numeric_columns=("cost",)))
    with pytest.raises(ConfigError, match="the label or an ignored column"):
        read_all([path], DataFormat("csv", label_column="click", numeric_columns=("click",)))
    with pytest.raises(ConfigError, match="criteo's 13 integer fields are numeric already"):
        DataFormat("criteo", numeric_columns=("x",))


def test_a_test_file_of_other_columns_is_refused_and_one_of_another_order_taken(tmp_path):
    """A test file whose header named other columns was scored as features the model never
    saw, without a word; columns are read by name, so their order may differ."""
    train, other, moved, marked = (tmp_path / n for n in ("train.csv", "other.csv", "moved.csv", "marked.csv"))
    train.write_text("y,a,b,num\n1,x,z,3\n")
    other.write_text("y,a,zz,num\n1,x,z,3\n")
    moved.write_text("num,b,a,y\n3,z,x,1\n")
    marked.write_bytes(b"\xef\xbb\xbfy,a,b,num\r\n1,x,z,3\r\n")
    csv.check_same_columns(str(train), [str(moved), str(marked)], "csv")
    with pytest.raises(ConfigError, match=r"other.csv:1: its columns are not those of .*train.csv .*: b, zz are in"):
        csv.check_same_columns(str(train), [str(moved), str(other)], "csv")
