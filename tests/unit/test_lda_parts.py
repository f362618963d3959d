"""``paramserver lda``'s pieces (issue 15): the sampler draws from the collapsed Gibbs
conditional and keeps its counts; counts travel exactly; the corpus readers take UCI
docword and LDA-C and name the file and line of a bad one."""

from __future__ import annotations

import gzip

import numpy as np
import pytest

from paramserver.apps.rounds.corpus import read_corpus
from paramserver.apps.rounds.lda_sampler import _doc_lists, _sample, _smoothing_draw, _span_shift
from paramserver.apps.rounds.lda_totals import decode, encode
from paramserver.data.reader import DataError


@pytest.mark.parametrize("small", [np.int32, np.uint16])  # the document counts' two widths
def test_one_draw_follows_the_collapsed_conditional(small):
    K, V, alpha, beta = 5, 7, 0.3, 0.05
    rng = np.random.default_rng(0)
    # one document of 12 tokens; the token sampled is the first (word 3, topic 2)
    words = np.r_[3, rng.integers(0, V, 11)].astype(np.int32)
    z0 = np.r_[2, rng.integers(0, K, 11)].astype(np.int32)
    others = rng.integers(0, 40, (V, K)).astype(np.int32)  # other documents' counts
    nwk0 = others.copy()
    np.add.at(nwk0, (words, z0), 1)
    nk0 = nwk0.sum(0).astype(np.int64)
    # the conditional with the token removed
    ndk = np.bincount(z0[1:], minlength=K)
    nw = nwk0[3].copy()
    nw[2] -= 1
    nk = nk0.copy()
    nk[2] -= 1
    p = (ndk + alpha) * (nw + beta) / (nk + V * beta)
    p /= p.sum()
    draws = 40_000
    counts = np.zeros(K)
    for i in range(draws):
        z = z0.copy()
        nwk, nk_ = nwk0[[3]].copy(), nk0.copy()
        ndk_ = np.zeros((1, K), small)
        doff, dcnt, dtop = np.array([0, K]), np.zeros(1, np.int32), np.zeros(K, small)
        docs = np.zeros(12, np.int32)
        _doc_lists(docs, z, ndk_, dtop, doff, dcnt)
        _sample(np.array([0]), np.array([0, 1]), 0, 1, docs, z, nwk, nk_, ndk_, dtop, doff, dcnt, alpha, beta,
                V * beta, np.zeros(K), np.zeros(K), 7 + i)  # a draw of its own seed each time
        counts[z[0]] += 1
        # the counts moved with the token
        assert nwk[0].sum() == nwk0[3].sum() and nk_.sum() == nk0.sum() and ndk_.sum() == 12
        assert nwk[0, z[0]] - nwk0[3, z[0]] == (0 if z[0] == 2 else 1)
        assert sorted(dtop[:dcnt[0]].tolist()) == np.flatnonzero(ndk_[0]).tolist()
    expected = p * draws
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 20.5, (counts, expected)  # 4 degrees of freedom: p ≈ 0.0004


def test_a_draw_in_the_smoothing_bucket_follows_its_weights_across_spans():
    """At K > 64 the smoothing bucket (α·Y_k) is walked span by span (``_smoothing_draw``): a
    token alone in its document always draws there, and its topic follows (n_wk + β)/(n_k + Vβ)
    over all 200 topics, four spans of 64 and a short one."""
    K, V, alpha, beta = 200, 9, 0.1, 0.01
    rng = np.random.default_rng(1)
    nwk0 = rng.integers(0, 30, (V, K)).astype(np.int32)
    nwk0[4, 3] += 1  # the token: word 4, topic 3
    nk0 = nwk0.sum(0).astype(np.int64)
    nw, nk = nwk0[4].astype(np.float64), nk0.astype(np.float64)
    nw[3] -= 1
    nk[3] -= 1
    p = (nw + beta) / (nk + V * beta)
    p /= p.sum()
    draws = 40_000
    counts = np.zeros(K)
    for i in range(draws):
        z, nwk, nk_ = np.array([3], np.int32), nwk0[[4]].copy(), nk0.copy()
        ndk, dtop, doff, dcnt = np.zeros((1, K), np.uint16), np.zeros(1, np.uint16), np.array([0, 1]), \
            np.zeros(1, np.int32)
        _doc_lists(np.zeros(1, np.int32), z, ndk, dtop, doff, dcnt)
        _sample(np.array([0]), np.array([0, 1]), 0, 1, np.zeros(1, np.int32), z, nwk, nk_, ndk, dtop, doff, dcnt,
                alpha, beta, V * beta, np.zeros(K), np.zeros(K), 11 + i)
        counts[z[0]] += 1
    expected = p * draws
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 271.3, chi2  # 199 degrees of freedom: p = 0.0005


@pytest.mark.parametrize("K,small", [(5, np.uint16), (200, np.uint16), (400, np.uint16), (300, np.int32)])
def test_a_sweep_keeps_every_count_at_every_width(K, small):
    """Sweeps of ``_sample`` over a random corpus keep ``n_wk``, ``n_k``, ``n_dk`` and the
    documents' topic lists those of the tokens' topics: one span (K = 5), spans (200), and
    spans with every line of a document's row fetched ahead (400 at 16 bits, 300 at 32)."""
    rng = np.random.default_rng(3)
    V, D, alpha, beta = 40, 30, 0.1, 0.01
    lens = rng.integers(1, 120, D)
    docs = np.repeat(np.arange(D), lens).astype(np.int32)
    words = rng.integers(0, V, docs.size).astype(np.int32)
    order = np.lexsort((docs, words))
    words, docs = words[order], docs[order]
    z = rng.integers(0, K, docs.size).astype(np.int32)
    nwk = np.zeros((V, K), np.int32)
    np.add.at(nwk, (words, z), 1)
    nk = np.bincount(z, minlength=K).astype(np.int64)
    ndk, doff = np.zeros((D, K), small), np.r_[0, np.cumsum(np.minimum(lens, K))].astype(np.int64)
    dtop, dcnt = np.zeros(int(doff[-1]), small), np.zeros(D, np.int32)
    _doc_lists(docs, z, ndk, dtop, doff, dcnt)
    starts = np.flatnonzero(np.r_[True, words[1:] != words[:-1]])
    seg_ptr, seg_row = np.r_[starts, words.size].astype(np.int64), words[starts].astype(np.int64)
    before = z.copy()
    for sweep in range(3):
        _sample(seg_row, seg_ptr, 0, seg_row.size, docs, z, nwk, nk, ndk, dtop, doff, dcnt, alpha, beta, V * beta,
                np.zeros(K), np.zeros(K), sweep)
    want = np.zeros((V, K), np.int64)
    np.add.at(want, (words, z), 1)
    np.testing.assert_array_equal(nwk, want)
    np.testing.assert_array_equal(nk, np.bincount(z, minlength=K))
    want_d = np.zeros((D, K), np.int64)
    np.add.at(want_d, (docs, z), 1)
    np.testing.assert_array_equal(ndk, want_d)
    for d in range(D):
        assert sorted(dtop[doff[d]:doff[d] + dcnt[d]].tolist()) == np.flatnonzero(want_d[d]).tolist()
    assert (z != before).mean() > 0.5  # the topics moved


def test_the_span_walk_lands_where_the_plain_walk_does():
    """``_smoothing_draw`` against a walk over every topic, at K from one span to many and at
    points spread over the whole mass (each away from a boundary by more than rounding)."""
    rng = np.random.default_rng(2)
    alpha = 0.1
    for K in (5, 64, 65, 200, 1000, 5000):
        Y = rng.random(K) * rng.integers(1, 5, K)
        shift = _span_shift(K)
        bsum = np.zeros(((K - 1) >> shift) + 1)
        np.add.at(bsum, np.arange(K) >> shift, Y)
        cum = np.cumsum(alpha * Y)
        for u in rng.random(2_000) * cum[-1]:
            want = int(np.searchsorted(cum, u, side="right"))
            if min(abs(cum[max(want - 1, 0)] - u), abs(cum[min(want, K - 1)] - u)) < 1e-9:
                continue
            assert _smoothing_draw(u, Y, bsum, shift, alpha) == want, (K, u)
        assert (K <= 64) == (bsum.size == 1)


def test_counts_travel_exactly_through_float32_halves():
    counts = np.array([0, 1, -1, (1 << 24) + 1, (1 << 40) + 12345, -(1 << 30) - 7], np.int64)
    halves = encode(counts)
    assert halves.dtype == np.float32
    np.testing.assert_array_equal(decode(halves[None])[0], counts)


@pytest.mark.parametrize("text,fmt", [
    ("3\n5\n4\n1 2 3\n1 5 1\n3 1 2\n3 2 1\n", "uci"),
    ("2 1:3 4:1\n0\n2 0:2 1:1\n", "ldac"),
])
def test_readers_give_the_same_tokens(tmp_path, text, fmt):
    path = tmp_path / ("c.txt.gz" if fmt == "uci" else "c.ldac")
    if fmt == "uci":
        with gzip.open(path, "wt") as f:
            f.write(text)
    else:
        path.write_text(text)
    c = read_corpus(str(path))
    assert c.docs == 3 and c.tokens == 7
    np.testing.assert_array_equal(c.doc_ptr, [0, 4, 4, 7])
    np.testing.assert_array_equal(c.words, [1, 1, 1, 4, 0, 0, 1])
    assert c.vocabulary == 5  # V from the header; the largest word + 1 for LDA-C


@pytest.mark.parametrize("text,line,what", [
    ("2\n5\n2\n1 2 3\n1 x 1\n", 5, "not a whole number"),
    ("2\n5\n2\n1 2 3\n3 1 1\n", 5, "doc must be in [1, D]"),
    ("2\n5\n2\n2 2 3\n1 1 1\n", 5, "must not go down"),
    ("2\n5\n2\n1 2 0\n1 1 1\n", 4, "count >= 1"),
    ("2\n5\n2\n1 2\n", 4, "three whole numbers"),
    ("2 1:3 4:1\n3 1:1 2:2\n", 2, "N (the first number)"),
    ("2 1:3 4:1\n1 1-1\n", 2, "word:count"),
    ("2 1:3 4:1\n1 -1:1\n", 2, "word ids must be >= 0"),
])
def test_readers_name_the_file_line_and_rule(tmp_path, text, line, what):
    path = tmp_path / "c.txt"
    path.write_text(text)
    with pytest.raises(DataError) as err:
        read_corpus(str(path))
    assert f"{path}:{line}:" in str(err.value) and what in str(err.value)


@pytest.mark.parametrize("text,what", [
    ("", "is empty"),
    ("two\n5\n1\n1 1 1\n", "not a UCI docword header"),
    ("2\n5\n3\n1 1 1\n", "NNZ=3 entries, the file has 1; fix the header or restore the missing lines"),
    ("2\n5\n1\n1 1 1\n2 2 1\n", "NNZ=1 entries, the file has 2; fix the header or remove the extra lines"),
])
def test_readers_refuse_bad_headers(tmp_path, text, what):
    path = tmp_path / "c.txt"
    path.write_text(text)
    with pytest.raises(DataError, match=what):
        read_corpus(str(path))


def test_a_text_corpus_is_its_words_numbered_by_its_vocabulary_or_by_itself(tmp_path):
    """A line a document, words up to a tab (OCTIS's corpus.tsv), blank lines no document;
    numbered by the vocabulary beside it, by --vocabulary, or by the corpus in byte order."""
    data = tmp_path / "corpus.tsv.gz"
    with gzip.open(data, "wt") as f:
        f.write("hot  cold\ttrain\t3\n\nwarm hot hot\ttest\n  \ncold\n")
    own = read_corpus(str(data))
    assert own.docs == 3 and own.tokens == 6 and own.vocabulary == 3
    assert own.names.tolist() == [b"cold", b"hot", b"warm"] and own.vocabulary_file is None
    np.testing.assert_array_equal(own.doc_ptr, [0, 2, 5, 6])
    np.testing.assert_array_equal(own.words, [1, 0, 2, 1, 1, 0])
    vocab = tmp_path / "vocabulary.txt"
    vocab.write_bytes(b"\xef\xbb\xbfwarm\nhot\r\ncold\nunused\n")
    beside = read_corpus(str(data))
    assert beside.names is None and beside.vocabulary_file == str(vocab) and beside.vocabulary == 4
    np.testing.assert_array_equal(beside.words, [1, 2, 0, 1, 1, 2])
    from paramserver.apps.rounds.corpus import top_words, vocabulary_size
    assert vocabulary_size(str(data), beside, None) == (4, str(vocab))
    assert vocabulary_size(str(data), own, None) == (3, None)
    assert top_words(np.array([[0, 5, 1]]), str(data), None, names=own.names) == [["hot", "warm"]]
    short = tmp_path / "short.txt"
    short.write_text("warm\nhot\n")
    with pytest.raises(DataError, match=r"corpus.tsv.gz:1: the word 'cold' is not in the vocabulary .*short.txt"):
        read_corpus(str(data), str(short))
    short.write_text("warm\nhot\ncold\nhot\n")
    with pytest.raises(DataError, match=r"short.txt:4: this word is listed twice: 'hot'"):
        read_corpus(str(data), str(short))


def test_text_words_are_numbered_as_sorting_them_would_through_the_tables_growth(tmp_path):
    """Thousands of words (the hash table and the words' arrays double several times), CRLF
    lines, tabs, runs of blanks, UTF-8: the numbering is that of np.unique over the words,
    or of a shuffled vocabulary's lines."""
    rng = np.random.default_rng(4)
    names = np.array(sorted({f"w{x}é".encode() for x in rng.integers(0, 10**6, 3000)}))
    docs = [names[rng.integers(0, names.size, rng.integers(1, 40))] for _ in range(500)]
    path = tmp_path / "c.txt"
    path.write_bytes(b"".join(b"  ".join(d) + (b"\tx y\r\n" if i % 3 else b" \r\n") for i, d in enumerate(docs)))
    flat = np.concatenate(docs)
    used, ids = np.unique(flat, return_inverse=True)
    own = read_corpus(str(path))
    assert own.names.tolist() == used.tolist() and np.array_equal(own.words, ids)
    np.testing.assert_array_equal(np.diff(own.doc_ptr), [d.size for d in docs])
    listed = rng.permutation(names)
    vocab = tmp_path / "v.txt"
    vocab.write_bytes(b"\n".join(listed))  # no newline after the last word
    numbered = read_corpus(str(path), str(vocab))
    line_of = {w: i for i, w in enumerate(listed.tolist())}
    assert numbered.vocabulary == names.size
    np.testing.assert_array_equal(numbered.words, [line_of[w] for w in flat.tolist()])


def test_a_docword_file_with_a_mangled_header_is_not_taken_for_text(tmp_path):
    path = tmp_path / "docword.txt"
    path.write_text("two\n5\n2\n1 1 1\n1 2 1\n")
    with pytest.raises(DataError, match="not a UCI docword header"):
        read_corpus(str(path))


def test_the_vocabulary_beside_an_lda_c_corpus_sets_v(tmp_path):
    from paramserver.apps.rounds.corpus import vocabulary_size
    from paramserver.errors import ConfigError

    data = tmp_path / "news.ldac.gz"
    with gzip.open(data, "wt") as f:
        f.write("2 0:1 3:2\n")
    corpus = read_corpus(str(data))
    assert corpus.vocabulary == 4
    assert vocabulary_size(str(data), corpus, None) == (4, None)  # nothing beside it
    (tmp_path / "news.tokens").write_text("".join(f"w{i}\n" for i in range(9)))
    assert vocabulary_size(str(data), corpus, None) == (9, str(tmp_path / "news.tokens"))
    (tmp_path / "news.tokens").write_text("a\nb\n")  # shorter than the corpus needs: not its vocabulary
    assert vocabulary_size(str(data), corpus, None) == (4, None)
    with pytest.raises(ConfigError, match="has 2 words"):
        vocabulary_size(str(data), corpus, str(tmp_path / "news.tokens"))
    uci = tmp_path / "docword.txt"
    uci.write_text("1\n7\n1\n1 2 1\n")
    (tmp_path / "vocab.txt").write_text("".join(f"w{i}\n" for i in range(20)))
    assert vocabulary_size(str(uci), read_corpus(str(uci)), None) == (7, None)  # the header says V


def test_top_words_name_each_topics_most_frequent_words_when_a_vocabulary_is_known(tmp_path):
    """Issue 33.12: LDA's output was only topic_word.npy."""
    import numpy as np

    from paramserver.apps.rounds.corpus import top_words

    data = tmp_path / "docword.train.txt"
    data.write_text("")
    n_kw = np.array([[0, 5, 1, 9], [7, 0, 0, 2]])
    assert top_words(n_kw, str(data), None) is None  # no vocabulary beside it
    (tmp_path / "vocab.txt").write_text("apple\nbanana\ncherry\ndate\n")
    assert top_words(n_kw, str(data), None, k=3) == [["date", "banana", "cherry"], ["apple", "date"]]
    short = tmp_path / "short.txt"
    short.write_text("apple\n")
    assert top_words(n_kw, str(data), str(short)) is None  # a vocabulary that does not cover the words


def test_top_words_rank_ties_by_word_and_match_a_whole_stable_sort():
    """The top columns come from the rows' k-th largest counts, not a sort of every row: the
    same words in the same order as a stable sort of each whole row (ties to the lower word),
    zeros left out, rows mostly zero and rows of one value included."""
    import numpy as np

    from paramserver.apps.rounds.corpus import _top_columns

    def whole_sort(n: np.ndarray, k: int) -> list[list[int]]:
        top = np.argsort(-n, axis=1, kind="stable")[:, :k]
        return [[int(w) for w in row if n[t, w] > 0] for t, row in enumerate(top)]

    assert _top_columns(np.array([[2, 3, 3, 0, 3, 1]]), 2) == [[1, 2]]  # three tie at 3: the lower two
    assert _top_columns(np.zeros((2, 4), np.int64), 3) == [[], []]
    assert _top_columns(np.array([[1, 1, 1]]), 5) == [[0, 1, 2]]  # k past the words
    rng = np.random.default_rng(5)
    for _ in range(200):
        shape = (int(rng.integers(1, 20)), int(rng.integers(1, 40)))
        n = rng.integers(0, 4, shape) * (rng.random(shape) < rng.random())
        k = int(rng.integers(0, 12))
        assert _top_columns(n, k) == whole_sort(n, k), (n, k)


def test_alphas_fixed_point_finds_the_prior_the_documents_were_drawn_from():
    """Documents whose topic mixtures come from a symmetric Dirichlet of a known α: the fixed
    point's steps (``alpha_sums`` over two workers' halves of the documents, summed, then
    ``alpha_step``) go from 0.1 to within 5 % of it, from above and from below, and stay."""
    from paramserver.apps.rounds.lda_sampler import ALPHA_MAX, ALPHA_MIN, alpha_step, alpha_sums

    rng = np.random.default_rng(3)
    K, D = 20, 3000
    for true in (0.03, 0.8):
        lengths = rng.integers(5, 60, D)
        ndk = np.stack([rng.multinomial(n, rng.dirichlet(np.full(K, true))) for n in lengths]).astype(np.uint16)
        halves = (slice(0, D // 2), slice(D // 2, D))
        alpha = 0.1
        for _ in range(300):
            sums = [alpha_sums(ndk[h], lengths[h], alpha) for h in halves]
            alpha = alpha_step(alpha, K, sum(s[0] for s in sums), sum(s[1] for s in sums))
        assert abs(alpha / true - 1) < 0.05, (true, alpha)
    assert alpha_step(0.1, K, 0.0, 0.0) == 0.1  # no token: it stays
    assert alpha_step(0.1, K, 1e-30, 1.0) == ALPHA_MIN and alpha_step(0.1, K, 1e30, 1.0) == ALPHA_MAX


def test_auto_learns_alpha_on_short_documents_only_and_a_number_is_taken_as_given():
    from paramserver.apps.rounds.lda import check_config
    from paramserver.apps.rounds.settings import LDAConfig
    from paramserver.errors import ConfigError

    auto = LDAConfig()
    assert auto.optimize_alpha == "auto" and auto.alpha_sweeps == 0  # unresolved: nothing learnt
    assert (auto.alpha_every(5.9), auto.alpha_every(19.9), auto.alpha_every(20.0), auto.alpha_every(145.0)) == \
        (1, 1, 0, 0)
    assert LDAConfig(optimize_alpha="3").alpha_every(5.9) == 3 and LDAConfig(optimize_alpha="0").alpha_every(5.9) == 0
    assert LDAConfig(optimize_alpha="2").alpha_sweeps == 2
    for bad in ("-1", "sometimes", "1.5"):
        with pytest.raises(ConfigError, match="--optimize-alpha"):
            check_config(LDAConfig(optimize_alpha=bad), workers=2, servers=1)
