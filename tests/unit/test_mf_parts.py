"""``paramserver mf``'s pieces (issue 15): one SGD step against numpy's gradient, the
balanced layout and strata, the rating reader's formats and its errors."""

from __future__ import annotations

import gzip

import numpy as np
import pytest

from paramserver.apps.rounds.mf import (
    MFConfig,
    MFProgram,
    _dense,
    _predict,
    _rows,
    _sgd,
    check_config,
)
from paramserver.apps.rounds.mf_strata import layout, save_strata, strata
from paramserver.apps.rounds.program import adopt, balanced_groups
from paramserver.apps.rounds.ratings import distinct_ids, read_ratings
from paramserver.data.reader import DataError
from paramserver.errors import ConfigError


def test_one_sgd_step_is_numpys_gradient_step():
    rng = np.random.default_rng(0)
    k, mu, lr, reg, reg_b = 8, 3.2, 0.05, 0.1, 0.02
    P = rng.normal(0, 0.3, (3, k + 1)).astype(np.float32)
    Q = rng.normal(0, 0.3, (4, k + 1)).astype(np.float32)
    p, q = P[1].astype(np.float64), Q[2].astype(np.float64)
    # the loss of one rating: ½(r − μ − b_u − b_i − p·q)² + ½reg(|p|² + |q|²) + ½reg_b(b_u² + b_i²)
    r = 4.5
    e = r - (mu + p[k] + q[k] + p[:k] @ q[:k])
    grad_p = np.r_[-e * q[:k] + reg * p[:k], -e + reg_b * p[k]]
    grad_q = np.r_[-e * p[:k] + reg * q[:k], -e + reg_b * q[k]]
    sse = _sgd(np.array([1], np.int32), np.array([2], np.int32), np.array([r], np.float32), P, Q, mu, lr, reg,
               reg_b)
    assert sse == pytest.approx(e * e, rel=1e-5)
    np.testing.assert_allclose(P[1], p - lr * grad_p, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(Q[2], q - lr * grad_q, rtol=1e-5, atol=1e-6)
    before = rng.normal(0, 0.3, (3, k + 1)).astype(np.float32)
    P2 = before.copy()
    _sgd(np.array([1], np.int32), np.array([0], np.int32), np.array([r], np.float32), P2, Q.copy(), mu, lr, reg,
         reg_b)
    np.testing.assert_array_equal(P2[[0, 2]], before[[0, 2]])


def test_predictions_are_clipped_and_unknown_ids_fall_back_to_the_biases():
    P = np.array([[1.0, 0.5]], np.float32)  # factor 1, bias 0.5
    Q = np.array([[2.0, -0.25]], np.float32)
    got = _predict(np.array([0, -1, 0, -1]), np.array([0, 0, -1, -1]), P, Q, 3.0, 1.0, 5.0)
    np.testing.assert_allclose(got, [5.0, 2.75, 3.5, 3.0])


def test_groups_hold_like_numbers_of_ratings_under_a_power_law():
    counts = (1e5 / np.arange(1, 5001) ** 1.1).astype(np.int64) + 1
    for parts in (2, 3, 8):
        g = balanced_groups(counts, parts)
        load = np.bincount(g, weights=counts, minlength=parts)
        # no group above the mean by more than 5 %, unless one entity alone is heavier
        assert load.max() <= max(1.05 * counts.sum() / parts, counts.max()), (parts, load)
        assert load.sum() == counts.sum()


def test_strata_cover_every_rating_once_with_local_indices(tmp_path):
    rng = np.random.default_rng(1)
    n_u, n_i, W = 50, 30, 3
    u, i = rng.integers(0, n_u, 2000), rng.integers(0, n_i, 2000)
    r = rng.integers(1, 6, 2000).astype(np.float32)
    lay = layout(np.bincount(u, minlength=n_u), np.bincount(i, minlength=n_i), W)
    paths = save_strata(str(tmp_path), strata(u, i, r, lay, W, 0))
    seen = []
    for q, path in enumerate(paths):
        z = np.load(path)
        assert z["start"][0] == 0 and z["start"][-1] == z["ratings"].size
        for b in range(W):
            lo, hi = z["start"][b], z["start"][b + 1]
            ukey = z["users"][lo:hi] + lay.user_start[q]
            ikey = z["items"][lo:hi] + lay.item_start[b]
            assert (ukey < lay.user_start[q + 1]).all() and (ikey < lay.item_start[b + 1]).all()
            uid = np.argsort(lay.user_key)[ukey]
            iid = np.argsort(lay.item_key)[ikey]
            assert (lay.user_group[uid] == q).all() and (lay.item_group[iid] == b).all()
            seen.append(np.c_[uid, iid, z["ratings"][lo:hi]])
    got = np.concatenate(seen)
    want = np.c_[u, i, r]
    np.testing.assert_array_equal(got[np.lexsort(got.T[::-1])], want[np.lexsort(want.T[::-1])])


def test_strata_keep_the_drawn_order_inside_each_stratum(tmp_path):
    """The one-pass grouping is the drawn order sorted stably by (user group, item block):
    SGD sees the ratings in the order the seed drew, whatever the grouping costs."""
    rng = np.random.default_rng(2)
    u, i = rng.integers(0, 40, 3000), rng.integers(0, 25, 3000)
    r = rng.integers(1, 6, 3000).astype(np.float32)
    for W in (1, 2, 3):
        lay = layout(np.bincount(u, minlength=40), np.bincount(i, minlength=25), W)
        perm = np.random.default_rng(5).permutation(r.size)
        drawn_u, drawn_i = u[perm], i[perm]
        order = np.argsort(lay.user_group[drawn_u] * W + lay.item_group[drawn_i], kind="stable")
        folder = tmp_path / f"w{W}"
        folder.mkdir()
        paths = save_strata(str(folder), strata(u, i, r, lay, W, 5))
        got = np.concatenate([np.load(p)["ratings"] for p in paths])
        np.testing.assert_array_equal(got, r[perm][order])
        users = np.concatenate([np.load(p)["users"] + lay.user_start[q] for q, p in enumerate(paths)])
        np.testing.assert_array_equal(users, lay.user_key[drawn_u[order]])


@pytest.mark.parametrize("ids", [
    np.array([5, 3, 5, 0, 9, 3], np.int64),  # small and dense: marked in an array
    np.array([-4, 7, -4, 2], np.int64),  # negative: sorted
    np.array([1 << 40, 3, 1 << 40, 17], np.int64),  # sparse: sorted
    np.zeros(0, np.int64),
])
def test_distinct_ids_are_numpys_unique(ids):
    found, inverse = distinct_ids(ids)
    want, want_inverse = np.unique(ids, return_inverse=True)
    assert found.dtype == want.dtype and inverse.dtype == want_inverse.dtype
    np.testing.assert_array_equal(found, want)
    np.testing.assert_array_equal(inverse, want_inverse)


@pytest.mark.parametrize("text", [
    "1\t10\t4\t881250949\n2\t20\t3.5\t1\n",  # u.data
    "userId,movieId,rating,timestamp\n1,10,4.0,964982703\n2,20,3.5,964981247\n",  # ratings.csv
    "1::10::4::978300760\r\n2::20::3.5::978302109\r\n",  # ratings.dat
    "1 10 4\n\n2 20 3.5",  # spaces, a blank line, no final newline
])
def test_reader_takes_the_movielens_formats(tmp_path, text):
    path = tmp_path / "r.gz"
    with gzip.open(path, "wt") as f:
        f.write(text)
    got = read_ratings(str(path))
    np.testing.assert_array_equal(got.users, [1, 2])
    np.testing.assert_array_equal(got.items, [10, 20])
    np.testing.assert_array_equal(got.ratings, np.array([4.0, 3.5], np.float32))


@pytest.mark.parametrize("line,what", [
    ("3\t30", "at least 3 fields"),
    ("x3\t30\t1", "user id"),
    ("3\t3.5\t1", "item id"),
    ("3\t30\tgood", "rating"),
    ("3\t30\tnan", "rating"),
])
def test_reader_names_the_file_line_and_rule(tmp_path, line, what):
    path = tmp_path / "r.tsv"
    path.write_text(f"1\t10\t4\n2\t20\t3\n{line}\n4\t40\t5\n")
    with pytest.raises(DataError) as err:
        read_ratings(str(path))
    assert f"{path}:3:" in str(err.value) and what in str(err.value)


def _fnv_bytes(name: bytes) -> int:
    h = 0xCBF29CE484222325
    for c in name:
        h = ((h ^ c) * 0x100000001B3) & (2**64 - 1)
    return h - 2**64 if h >= 2**63 else h


def _fnv(name: str) -> int:
    return _fnv_bytes(name.encode())


def test_reader_takes_names_for_ids_as_surprise_does(tmp_path):
    """Ids that are names (Amazon's ratings files: no header, a user's and an item's code): the
    first data line says so for each column; a name is its bytes' FNV-1a hash, and each
    distinct hash's name is kept in the hashes' sorted order (``distinct_ids``'), for --save.
    A test file is read as its training file was: there "17" is a name too."""
    path = tmp_path / "amazon.csv"
    path.write_text("A2SUAM1J3GNN3B,0132793040,5.0,1365811200\nAKM1MP6P0OYPR,0321732944,4.0,1341100800\n"
                    "A2SUAM1J3GNN3B,0321732944,3.0,1\n17,0132793040,2,1\n")
    got = read_ratings(str(path))
    assert got.named == (True, False) and got.item_names is None  # "0132793040" reads as a number
    users = ["A2SUAM1J3GNN3B", "AKM1MP6P0OYPR", "A2SUAM1J3GNN3B", "17"]
    np.testing.assert_array_equal(got.users, [_fnv(x) for x in users])
    np.testing.assert_array_equal(got.items, [132793040, 321732944, 321732944, 132793040])
    found, _ = distinct_ids(got.users)
    assert [_fnv(x) for x in got.user_names] == found.tolist()
    assert sorted(got.user_names.tolist()) == sorted(set(users))
    held = tmp_path / "test.tsv"
    held.write_text("user\titem\trating\n17\t0321732944\t1\n")
    assert read_ratings(str(held), got.named).users.tolist() == [_fnv("17")]
    assert read_ratings(str(held)).users.tolist() == [17]  # alone, its ids are numbers
    held.write_text("A2SUAM1J3GNN3B\t0321732944\t1\n")  # names, where the training file's users are numbers
    with pytest.raises(DataError, match=r"test.tsv:1: the user id .* a test file's, as its training file's"):
        read_ratings(str(held), (False, False))
    path.write_text("A1,B1,5\nA2,B2,4\n")  # no header: the first line is data, not skipped
    both = read_ratings(str(path))
    assert both.named == (True, True) and sorted(both.item_names.tolist()) == ["B1", "B2"]
    path.write_text("Zoë,B1,5\nA2,Łódź,4\nZoë,B1,3\n", encoding="utf-8")  # names past ASCII, as UTF-8
    utf = read_ratings(str(path))
    assert sorted(utf.user_names.tolist()) == ["A2", "Zoë"] and sorted(utf.item_names.tolist()) == ["B1", "Łódź"]
    assert [_fnv_bytes("Zoë".encode()), _fnv_bytes(b"A2")] == utf.users[:2].tolist()
    path.write_text("A1,10,5\nA2,B2,4\n")  # the items are numbers, as the first line's: B2 is wrong
    with pytest.raises(DataError, match=r"amazon.csv:2: the item id \(second field\) is not a whole number"):
        read_ratings(str(path))


def test_reader_refuses_an_empty_file(tmp_path):
    path = tmp_path / "r.csv"
    path.write_text("userId,movieId,rating,timestamp\n")
    with pytest.raises(DataError, match="no ratings"):
        read_ratings(str(path))


@pytest.mark.parametrize("line", ["1\t2\t\t0", "2,,4,9", ",1,2,5", "1::::3::9"])
def test_an_empty_field_is_refused_by_its_line_not_filled_from_the_next(tmp_path, line):
    """'1<tab>2<tab><tab>0' read the timestamp as the rating; a run of spaces, '::' and a CR
    before the newline are still one separator."""
    path = tmp_path / "r.txt"
    path.write_text(f"1 2 5\n{line}\n")
    with pytest.raises(DataError, match=r"r.txt:2: a field of the first three \(user, item, rating\) is empty"):
        read_ratings(str(path))
    path.write_text("1  2   5\r\n2::3::4::978300761\n3,1,3.5,9\n4\t1\t2\t9\n")
    assert read_ratings(str(path)).ratings.tolist() == [5.0, 4.0, 3.5, 2.0]


def test_a_dead_workers_parts_go_to_the_least_loaded_survivors_and_the_rest_stay():
    assert adopt([0, 1, 2, 3], [0, 2, 3]) == [0, 0, 2, 3]
    assert adopt([0, 1, 2, 3], [0, 3]) == [0, 0, 3, 3]  # 1 to 0 (tie, lower rank), then 2 to 3 (fewer)
    assert adopt([0, 0, 1, 2], [1, 2]) == [1, 2, 1, 2]
    assert adopt([0, 1], [0, 1]) == [0, 1]


def _program(W: int, epochs: int, user_sync: int, checkpoint_every: int = 0) -> MFProgram:
    """An MFProgram with no client and no parts: only its schedule of user pushes."""
    program = MFProgram.__new__(MFProgram)
    program.W, program.rounds, program.checkpoint_every = W, epochs * W, checkpoint_every
    program.cfg = MFConfig(epochs=epochs, user_sync=user_sync)
    return program


def test_user_rows_go_to_the_servers_every_user_sync_epochs_at_checkpoints_and_at_the_end():
    def pushed_after_epochs(program):
        return [(r + 1) // program.W for r in range(program.rounds) if program.users_due(r)]

    assert pushed_after_epochs(_program(W=2, epochs=12, user_sync=5)) == [5, 10, 12]
    assert pushed_after_epochs(_program(W=3, epochs=4, user_sync=1)) == [1, 2, 3, 4]
    assert pushed_after_epochs(_program(W=2, epochs=9, user_sync=100)) == [9]
    # a checkpoint every 3 epochs (in rounds: 3 W) pushes them too, so a resume starts from its epoch
    assert pushed_after_epochs(_program(W=2, epochs=12, user_sync=5, checkpoint_every=6)) == [3, 5, 6, 9, 10, 12]


def test_a_bad_user_sync_is_refused_by_name():
    with pytest.raises(ConfigError, match="--user-sync"):
        check_config(MFConfig(user_sync=0), workers=2, servers=1)


def test_exported_rows_come_back_by_dense_index_with_zeros_for_keys_never_stored():
    rng = np.random.default_rng(3)
    key_of = rng.permutation(6)  # dense index -> key
    rows = np.arange(18, dtype=np.float32).reshape(6, 3)
    order = rng.permutation(6)
    got = _rows((order.astype(np.uint64), rows[order]), key_of)  # every key, in the servers' order
    np.testing.assert_array_equal(got, rows[key_of])
    some = np.array([4, 1, 9], np.uint64)  # key 9 is outside the table: ignored
    got = _rows((some, np.ones((3, 3), np.float32)), key_of)
    np.testing.assert_array_equal(got, np.isin(key_of, [4, 1])[:, None] * np.ones((6, 3), np.float32))


@pytest.mark.parametrize("seed", range(6))
def test_dense_indices_by_table_or_search_are_the_sorted_ids_positions(seed):
    """``_dense`` takes a table where the known ids are small whole numbers and searches
    otherwise: either way each id's position among the known, -1 where it is not one."""
    rng = np.random.default_rng(seed)
    top = [50, 10_000, 1 << 21, 2**40, 100, 7][seed]
    known = np.unique(rng.integers(-3 if seed == 5 else 0, top, 200))
    ids = np.concatenate([rng.choice(known, 300), rng.integers(-10, top + 10, 300), [top * 4, -1]])
    where = {int(k): n for n, k in enumerate(known)}
    assert _dense(ids, known).tolist() == [where.get(int(x), -1) for x in ids]
    assert _dense(ids, known[:0]).tolist() == [-1] * ids.size
