"""The bundled embedding model: deterministic, unit-length, 384 dimensions, a faithful fast query path."""

from __future__ import annotations

import numpy as np
import pytest

from memory import bundled_model_path

TEXTS = [
    "sort a list of integers in descending order",
    "What is the capital of France?",
    "rotate the nginx access logs every week and compress the old ones",
    "ünïcödé and emoji 🚀 survive tokenization",
    "x",
]


def test_bundled_model_is_on_disk():
    path = bundled_model_path()
    assert (path / "config.json").is_file()


def test_model_id_names_model_and_dimensions(embedder):
    assert embedder.model_id == "all-MiniLM-L6-v2/384"
    assert embedder.dimensions == 384


def test_document_vectors_are_deterministic_unit_length_384(embedder):
    first = embedder.embed_documents(TEXTS)
    second = embedder.embed_documents(list(reversed(TEXTS)))[::-1]
    assert first.shape == (len(TEXTS), 384)
    assert first.dtype == np.float32
    np.testing.assert_allclose(first, second, atol=1e-5)  # batch order does not matter
    np.testing.assert_array_equal(first, embedder.embed_documents(TEXTS))
    np.testing.assert_allclose(np.linalg.norm(first, axis=1), 1.0, atol=1e-5)
    assert len({row.tobytes() for row in first}) == len(TEXTS)


def test_no_documents_give_an_empty_matrix(embedder):
    empty = embedder.embed_documents([])
    assert empty.shape == (0, 384)


def test_query_vectors_are_deterministic_and_unit_length(embedder):
    for text in TEXTS:
        vector = embedder.embed_query(text)
        assert vector.shape == (384,) and vector.dtype == np.float32
        np.testing.assert_array_equal(vector, embedder.embed_query(text))
        assert np.linalg.norm(vector) == pytest.approx(1.0, abs=1e-5)


QUERIES = [
    "x",
    "?",
    "sort a list of integers in descending order",
    "What is the capital of France?",
    "rotate the nginx access logs every week and compress the old ones",
    "ünïcödé and emoji 🚀 survive tokenization",
    "fix bug",
    "write a function that reverses a string",
]


@pytest.mark.parametrize("text", QUERIES)
def test_the_fast_query_path_computes_the_same_vector(embedder, text):
    fast = embedder.embed_query(text)
    full = embedder.embed_query(text, full_precision=True)
    assert embedder._query_model is not None  # the ONNX Runtime path is really in use
    assert float(fast @ full) > 0.99999
    # The full-precision single-query path is the document path, vector for vector.
    document = embedder.embed_documents([text])[0]
    assert float(full @ document) > 0.999


def test_vectors_carry_meaning(embedder):
    cat, kitten, stocks = embedder.embed_documents(
        ["a cat sleeps on the mat", "a kitten naps on a rug", "the stock market fell sharply today"]
    )
    assert cat @ kitten > cat @ stocks + 0.2
    query = embedder.embed_query("a small cat resting")
    assert query @ kitten > query @ stocks


RACE_S = 8.0  # long enough that the unsafe build failed in every run (4 failures in 10 s on 2 cores)


def test_queries_and_batches_from_many_threads_at_once_give_the_same_vectors(embedder):
    """The fast query path shared the batch embedder's fast tokenizer, which is not thread-safe: each call
    sets the tokenizer's padding (a batch pads, a query does not), so a batch tokenized just after a query
    reset it came back ragged ("Unable to create tensor ... activate padding"), and in the daemon a
    finished task was then recorded as an internal error. Six query threads and two batch threads race
    for a few seconds (the failure came within them before); every vector must be what one thread alone
    computes."""
    import threading
    import time

    queries = [f"q {'word ' * (n % 9)}{n}" for n in range(40)]
    batches = [["short", "word " * 3], ["x", "a longer text to pad against, with more words in it"]]
    alone_q = {q: embedder.embed_query(q) for q in queries}
    alone_b = [embedder.embed_documents(b) for b in batches]
    failures: list[str] = []
    deadline = time.monotonic() + RACE_S

    def ask(offset: int) -> None:
        n = offset
        while time.monotonic() < deadline and not failures:
            q = queries[n % len(queries)]
            n += 1
            try:
                if not np.allclose(embedder.embed_query(q), alone_q[q], atol=1e-5):
                    failures.append(f"query {q!r}: another vector")
            except Exception as exc:  # noqa: BLE001 - what the race raised is the finding
                failures.append(f"query {q!r}: {type(exc).__name__}: {exc}"[:300])

    def batch(offset: int) -> None:
        n = offset
        while time.monotonic() < deadline and not failures:
            k = n % len(batches)
            n += 1
            try:
                if not np.allclose(embedder.embed_documents(batches[k]), alone_b[k], atol=1e-5):
                    failures.append(f"batch {k}: other vectors")
            except Exception as exc:  # noqa: BLE001
                failures.append(f"batch {k}: {type(exc).__name__}: {exc}"[:300])

    workers = [threading.Thread(target=ask, args=(i,)) for i in range(6)]
    workers += [threading.Thread(target=batch, args=(i,)) for i in range(2)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(RACE_S + 120)
    assert not failures, failures[:3]


def test_a_text_embedded_as_a_query_is_not_embedded_again_as_a_document(embedder, monkeypatch):
    """A task's prompt is the query for its context and later the document its trajectory is indexed by:
    the second embedding takes the vector the first computed, and only the texts not seen lately are encoded."""
    import memory.embedder as embedder_module

    prompt = "sum the price column of invoices.csv, a prompt embedded for its context and then indexed"
    other = "a text never asked as a query"
    reference = embedder.embed_query(prompt, full_precision=True)  # the reference path keeps nothing
    model = embedder._load()
    encoded: list[list[str]] = []
    encode = model.encode

    def spy(texts, **kwargs):
        encoded.append(list(texts))
        return encode(texts, **kwargs)

    monkeypatch.setattr(model, "encode", spy)
    assert embedder.embed_documents([prompt]) is not None and encoded == [[prompt]]  # not asked as a query yet
    query = embedder.embed_query(prompt)
    with pytest.raises(ValueError):
        query[0] = 1.0  # shared: read-only
    encoded.clear()
    documents = embedder.embed_documents([other, prompt])
    assert encoded == [[other]]
    assert np.array_equal(documents[1], query) and float(documents[1] @ reference) > 0.99999
    assert float(documents[0] @ embedder.embed_query(other, full_precision=True)) > 0.99999
    # Only the latest queries are kept.
    monkeypatch.setattr(embedder_module, "RECENT_QUERIES", 2)
    for text in ("first query of three", "second query of three", "third query of three"):
        embedder.embed_query(text)
    encoded.clear()
    embedder.embed_documents(["first query of three", "third query of three"])
    assert encoded == [["first query of three"]]


def test_the_query_path_does_not_spin_for_work_between_queries(embedder):
    """A daemon embeds one query per task and then waits: threads spinning for the next run would burn the
    cores its workers and its API share (how much: the daemon's CPU per task in benchmarks/api_bench.py)."""
    embedder._load()
    options = embedder._query_model._session.get_session_options()
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"
