"""``paramserver lda --sampler mh`` (issue 49): the alias tables draw their weights; a sweep
leaves the collapsed posterior where it was; the counts and
the document index stay those of ``z``; on planted topics it gets as far as SparseLDA in
the same sweeps; ``--sampler`` and ``--mh-steps`` are checked."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from paramserver.apps.rounds.lda import check_config
from paramserver.apps.rounds.lda_mh import MHIndex, _alias
from paramserver.apps.rounds.lda_sampler import LDAConfig, _doc_lists, _doc_loglik, _sample, word_loglik
from paramserver.errors import ConfigError


@pytest.mark.parametrize("n", [1, 2, 7, 300])
def test_the_alias_table_draws_its_weights(n):
    rng = np.random.default_rng(n)
    weight = rng.pareto(1.0, n) + 1e-9  # heavy-tailed: some slots far above the mean
    top = rng.permutation(1000)[:n].astype(np.int32)
    prob, alt = np.zeros(n), np.zeros(n, np.int32)
    _alias(weight.copy(), top, n, weight.sum(), prob, alt, np.zeros(n, np.int32), np.zeros(n, np.int32))
    # slot j (probability 1/n) gives top[j] with prob[j], else alt[j]: exactly the weights
    drawn = np.zeros(1000)
    np.add.at(drawn, top, prob / n)
    np.add.at(drawn, alt, (1 - prob) / n)
    np.testing.assert_allclose(drawn[top], weight / weight.sum(), rtol=1e-9, atol=1e-12)
    assert drawn.sum() == pytest.approx(1.0)
    # and drawn as the sampler draws: x uniform in [0, n), slot ⌊x⌋, its threshold against x − ⌊x⌋
    x = rng.random(200_000) * n
    j = x.astype(np.int64)
    counts = np.bincount(np.where(x - j < prob[j], top[j], alt[j]), minlength=1000)[top]
    expected = weight / weight.sum() * x.size
    big = expected > 20
    if big.sum() > 1:
        chi2 = float((((counts - expected) ** 2 / expected)[big]).sum())
        assert chi2 < big.sum() + 6 * np.sqrt(2 * big.sum()), chi2


def _state(words, docs, z, V, K):
    """nwk, nk, ndk and the segments of tokens sorted by (word, doc): one block."""
    nwk = np.zeros((V, K), np.int32)
    np.add.at(nwk, (words, z), 1)
    ndk = np.zeros((docs.max() + 1, K), np.uint16)
    np.add.at(ndk, (docs, z), 1)
    starts = np.flatnonzero(np.r_[True, words[1:] != words[:-1]])
    return nwk, nwk.sum(0).astype(np.int64), ndk, np.r_[starts, words.size].astype(np.int64), words[starts].astype(
        np.int64)


def test_a_sweep_keeps_the_collapsed_posterior():
    """Two tokens of one word in one document, their topics drawn from their joint collapsed
    posterior: after a sweep they are still so distributed.  The second token's proposals
    read the first's topic after it moved (word and document), a wrong acceptance ratio or
    a proposal that reads the token's own topic shows as a χ² far off (LightLDA's table
    built once a word from the counts the sweep moves: 157)."""
    K, V, alpha, beta = 4, 3, 0.4, 0.3
    # the rest of the corpus: doc 0 holds tokens of words 1, 2; words 0 (ours), 1, 2 elsewhere too
    rest_words = np.array([1, 2, 2, 0, 0, 1, 2, 0], np.int32)
    rest_docs = np.array([0, 0, 0, 1, 1, 1, 2, 2], np.int32)
    rest_z = np.array([0, 1, 1, 2, 3, 3, 0, 2], np.int32)
    nw0 = np.bincount(rest_z[rest_words == 0], minlength=K)
    nk0 = np.bincount(rest_z, minlength=K)
    nd0 = np.bincount(rest_z[rest_docs == 0], minlength=K)
    joint = np.zeros((K, K))
    for a, b in itertools.product(range(K), range(K)):
        same = int(a == b)
        joint[a, b] = ((nd0[a] + alpha) * (nw0[a] + beta) / (nk0[a] + V * beta)
                       * (nd0[b] + same + alpha) * (nw0[b] + same + beta) / (nk0[b] + same + V * beta))
    joint /= joint.sum()
    words = np.r_[np.zeros(2, np.int32), rest_words]
    docs = np.r_[np.zeros(2, np.int32), rest_docs]
    order = np.lexsort((docs, words))  # stable: our two tokens stay first
    words, docs = words[order], docs[order]
    rng = np.random.default_rng(3)
    draws = 30_000
    counts = np.zeros(K * K)
    for i, cell in enumerate(rng.choice(K * K, draws, p=joint.ravel())):
        z = np.r_[np.array(divmod(int(cell), K), np.int32), rest_z][order].astype(np.int32)
        nwk, nk, ndk, seg_ptr, seg_row = _state(words, docs, z, V, K)
        mh = MHIndex(docs, z, np.bincount(docs), K, steps=1)
        mh.sample(seg_row, seg_ptr, 0, 1, docs, z, nwk, nk, ndk, alpha, beta, V * beta, seed=i)  # word 0 only
        counts[z[0] * K + z[1]] += 1
    expected = joint.ravel() * draws
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 42.0, (counts.reshape(K, K), expected.reshape(K, K))  # 15 degrees of freedom: p ≈ 0.0002


def _corpus(docs=120, length=50, V=60, topics=4, seed=0):
    """Documents that each mix two of ``topics`` disjoint word sets, tokens sorted by (word, doc)."""
    rng = np.random.default_rng(seed)
    per = V // topics
    words, doc_of = [], []
    for d in range(docs):
        a, b = rng.choice(topics, 2, replace=False)
        words.append(np.where(rng.random(length) < 0.7, a, b) * per + rng.integers(0, per, length))
        doc_of.append(np.full(length, d))
    w, d = np.concatenate(words).astype(np.int32), np.concatenate(doc_of).astype(np.int32)
    order = np.lexsort((d, w))
    return w[order], d[order]


def test_counts_and_the_document_index_stay_those_of_z():
    K, V = 7, 60
    words, docs = _corpus(V=V)
    z = np.random.default_rng(1).integers(0, K, words.size).astype(np.int32)
    nwk, nk, ndk, seg_ptr, seg_row = _state(words, docs, z, V, K)
    mh = MHIndex(docs, z, np.bincount(docs), K, steps=2)
    blocks = np.r_[0, seg_row.size // 3, seg_row.size]  # two calls: two blocks, the smoothing table rebuilt
    moved = 0
    for sweep in range(5):
        before = z.copy()
        for lo, hi in zip(blocks[:-1], blocks[1:]):
            mh.sample(seg_row, seg_ptr, int(lo), int(hi), docs, z, nwk, nk, ndk, 0.1, 0.01, V * 0.01, seed=sweep)
        moved += int((z != before).sum())
    assert moved > words.size  # it does move
    again, nk2, ndk2, _, _ = _state(words, docs, z, V, K)
    np.testing.assert_array_equal(nwk, again)
    np.testing.assert_array_equal(nk, nk2)
    np.testing.assert_array_equal(ndk, ndk2)
    np.testing.assert_array_equal(mh.zd[mh.tpos], z)  # the index of each document's tokens follows z
    np.testing.assert_array_equal(np.sort(mh.tpos), np.arange(z.size))
    assert not mh.ad.any()  # the scratch of other workers' counts is left clean for the next word
    # SparseLDA's topic lists, rebuilt from n_dk for a checkpoint
    doff = np.r_[0, np.cumsum(np.minimum(np.bincount(docs), K))]
    dtop, dcnt = np.zeros(doff[-1], np.uint16), np.zeros(ndk.shape[0], np.int32)
    MHIndex.lists(ndk, dtop, doff, dcnt)
    for d in range(ndk.shape[0]):
        assert dtop[doff[d]:doff[d] + dcnt[d]].tolist() == np.flatnonzero(ndk[d]).tolist()


def _loglik(words, docs, z, V, K, alpha, beta):
    nwk, _, ndk, _, _ = _state(words, docs, z, V, K)
    return (word_loglik(nwk.T.astype(np.int64), beta) + _doc_loglik(ndk, np.bincount(docs), alpha)) / z.size


def test_on_planted_topics_it_gets_as_far_as_sparse_lda_in_the_same_sweeps():
    K, V, alpha, beta, sweeps = 4, 60, 0.1, 0.01, 60
    words, docs = _corpus(docs=200, V=V)
    lens = np.bincount(docs)
    z0 = np.random.default_rng(5).integers(0, K, words.size).astype(np.int32)
    found = {}
    for sampler in ("sparse", "mh"):
        z = z0.copy()
        nwk, nk, ndk, seg_ptr, seg_row = _state(words, docs, z, V, K)
        n = seg_row.size
        if sampler == "mh":
            mh = MHIndex(docs, z, lens, K, steps=2)
            for s in range(sweeps):
                mh.sample(seg_row, seg_ptr, 0, n, docs, z, nwk, nk, ndk, alpha, beta, V * beta, seed=s)
        else:
            doff = np.r_[0, np.cumsum(np.minimum(lens, K))]
            dtop, dcnt, ndk = np.zeros(doff[-1], np.uint16), np.zeros(lens.size, np.int32), np.zeros_like(ndk)
            _doc_lists(docs, z, ndk, dtop, doff, dcnt)
            for s in range(sweeps):
                _sample(seg_row, seg_ptr, 0, n, docs, z, nwk, nk, ndk, dtop, doff, dcnt, alpha, beta, V * beta,
                        np.zeros(K), np.zeros(K), s)
        mass = nwk.T.reshape(K, K, V // K).sum(2) / nwk.sum(0)[:, None]  # topic k's share in each planted set
        assert (mass.max(1) > 0.9).all() and sorted(mass.argmax(1).tolist()) == [0, 1, 2, 3], (sampler, mass)
        found[sampler] = _loglik(words, docs, z, V, K, alpha, beta)
    start = _loglik(words, docs, z0, V, K, alpha, beta)
    assert abs(found["mh"] - found["sparse"]) < 0.01 * (found["sparse"] - start), (found, start)


@pytest.mark.parametrize("field,value,message", [
    ("sampler", "gibbs", "--sampler must be auto (the default), sparse (the exact Gibbs draw), mh"),
    ("mh_steps", 0, "--mh-steps must be a whole number in [1, 64]"),
    ("mh_share", 0, "--mh-share must be a number in (0, 1]"),
    ("mh_share", 1.5, "--mh-share must be a number in (0, 1]"),
])
def test_a_bad_sampler_setting_is_refused_naming_the_value_and_the_rule(field, value, message):
    with pytest.raises(ConfigError) as err:
        check_config(LDAConfig(**{field: value}), workers=2, servers=1)
    assert message in str(err.value) and str(err.value).endswith(f"got {value}")
    check_config(LDAConfig(sampler="mh", mh_steps=4), workers=2, servers=1)


def test_auto_is_hybrid_from_mh_topics_with_one_mh_step_and_sparse_below():
    """What the job runs and reports: ``auto`` resolved by the topics, the MH steps by the sampler."""
    from paramserver.apps.rounds.lda import resolved
    from paramserver.apps.rounds.settings import MH_TOPICS

    assert LDAConfig().sampler == "auto" and LDAConfig().mh_steps is None
    assert resolved(LDAConfig(topics=MH_TOPICS - 1)) == LDAConfig(topics=MH_TOPICS - 1, sampler="sparse")
    big = resolved(LDAConfig(topics=MH_TOPICS))
    assert (big.sampler, big.mh_steps, big.mh_sweeps) == ("hybrid", 1, 100)  # half of 200 sweeps
    assert resolved(LDAConfig(sampler="mh")).mh_steps == 2 and resolved(LDAConfig(sampler="mh")).mh_sweeps == 200
    assert resolved(LDAConfig(sampler="hybrid", mh_steps=3, mh_share=0.25, iterations=10)).mh_sweeps == 2
    assert resolved(LDAConfig(sampler="sparse", topics=5000)).mh_sweeps == 0
    assert LDAConfig(topics=MH_TOPICS).mh_sweeps == 100  # the program, handed an unresolved config, runs the same
