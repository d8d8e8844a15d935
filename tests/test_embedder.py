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
