"""Benchmark the experience store at 10k and 100k trajectories; prints JSON.

    python benchmarks/memory_bench.py [--sizes 10000,100000] [--queries 200] [--out FILE] [--quick]

Stores are built from generated, realistic task texts (``task_texts.py``) with
real embeddings from the bundled all-MiniLM-L6-v2. Each figure is set against
a floor measured in the same run, because the machine is shared and noisy:

* ingest rate (trajectories/s, SQLite + FTS + embedding + Chroma) against the
  rate of batched embedding alone. Ingest runs in chunks, and before each chunk
  a sample of that chunk's texts is embedded on its own; both see the same
  machine. Target: ingest >= 0.8x embed-only.
* one task's full context (``Store.context``: query embedding, three
  collections, FTS, fusion, row lookups) p50/p95 against one full-precision
  query embedding by the plain ``SentenceTransformer.encode`` path plus one raw
  Chroma query, timed alternately with the same query texts. Target: context
  p95 <= 1.5x floor p95.
* recall@5 of the HNSW index against exact brute force over the stored
  vectors, and of the fast (ONNX Runtime) query embedding against the PyTorch one
  (both by brute force). Target: >= 0.95 each.

Queries are distinct texts that are not in the store, from the same generator
with another seed. The benchmark reports; it never asserts.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from task_texts import ANSWERS, insight_texts, task_texts, tool_specs  # noqa: E402

import memory.search as memory_search  # noqa: E402
from memory import Embedder, Filters, NewTrajectory, Store, StoreOptions  # noqa: E402

INGEST_CHUNK = 2000
FLOOR_SAMPLE_PER_CHUNK = 128  # two batches of 64, embedded alone before each chunk
N_INSIGHTS = 300
N_TOOLS = 100
QUERY_SEED = 424242


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


def make_items(texts: list[str], seed: int) -> list[NewTrajectory]:
    rng = random.Random(seed)
    items = []
    for text in texts:
        roll = rng.random()
        success = True if roll < 0.7 else (False if roll < 0.9 else None)
        items.append(
            NewTrajectory(
                prompt=text, final_answer=rng.choice(ANSWERS), success=success, started_at=1.7e9 + rng.random() * 3e7
            )
        )
    return items


def stored_vectors(store: Store, collection: str) -> tuple[list[str], np.ndarray]:
    """Every id and vector Chroma holds for a collection (what brute force searches)."""
    coll = store.index._collections[collection]  # the benchmark reads Chroma directly
    ids, vectors, offset, page = [], [], 0, 5000
    while True:
        got = coll.get(include=["embeddings"], limit=page, offset=offset)
        if got["ids"]:
            ids.extend(got["ids"])
            vectors.append(np.asarray(got["embeddings"], dtype=np.float32).reshape(len(got["ids"]), -1))
        if len(got["ids"]) < page:
            break
        offset += page
    return ids, np.concatenate(vectors) if vectors else np.zeros((0, 384), np.float32)


def top_k(matrix: np.ndarray, vector: np.ndarray, k: int) -> np.ndarray:
    scores = matrix @ vector
    part = np.argpartition(-scores, k)[:k]
    return part[np.argsort(-scores[part])]


def measure_keyword_pruning(store: Store, queries: list[str]) -> dict:
    """The keyword leg skips the commonest words once a query's postings pass
    ``memory.search.POSTINGS_BUDGET``. Against the same search with every word:
    the tie-aware recall@20 of the keyword ranking (a result counts if its BM25
    under all words is at least the exact 20th best), and how often the context's
    trajectories come out the same."""
    where, params = Filters(success=True).sql("t")
    join = "LEFT JOIN outcomes o ON o.trajectory_id = t.id"

    def search(q):
        return memory_search.keyword_search(
            store.database.writer, "trajectories", q, 20, where=where, params=params, join=join
        )

    recalls, same_context = [], 0
    saved = memory_search.POSTINGS_BUDGET
    for q in queries:
        pruned = search(q)
        pruned_context = [h.trajectory_id for h in store.retrieval.context(q).trajectories]
        memory_search.POSTINGS_BUDGET = None
        try:
            full = search(q)
            full_context = [h.trajectory_id for h in store.retrieval.context(q).trajectories]
        finally:
            memory_search.POSTINGS_BUDGET = saved
        same_context += pruned_context == full_context
        if not full:
            continue
        expression = memory_search.match_expression(q)
        ids = sorted(set(pruned) | set(full))
        scores = dict(
            store.database.writer.execute(
                f"""SELECT t.id, bm25(trajectories_fts) FROM trajectories_fts
                JOIN trajectories t ON t.rowid = trajectories_fts.rowid
                WHERE trajectories_fts MATCH ? AND t.id IN ({",".join("?" * len(ids))})""",
                [expression, *ids],
            ).fetchall()
        )
        threshold = max(scores[i] for i in full)  # BM25 is negative: lower is better
        recalls.append(sum(1 for i in pruned if scores[i] <= threshold + 1e-9) / len(full))
    return {
        "postings_budget": saved,
        "keyword_recall_at_20_vs_all_words": round(float(np.mean(recalls)), 4) if recalls else None,
        "context_trajectories_same_as_all_words": round(same_context / len(queries), 4),
    }


def bench_size(n: int, n_queries: int, embedder: Embedder, options: StoreOptions, log) -> dict:
    texts = task_texts(n, seed=0)
    in_store = set(texts)
    queries, seen = [], set()
    for q in task_texts(n_queries * 3, seed=QUERY_SEED + n):
        if q not in in_store and q not in seen:
            seen.add(q)
            queries.append(q)
        if len(queries) == n_queries:
            break
    items = make_items(texts, seed=n)
    model = embedder._load()
    rng = random.Random(7)

    root = Path(tempfile.mkdtemp(prefix=f"memory-bench-{n}-"))
    try:
        store = Store.open(root, embedder=embedder, options=options)
        try:
            # --- ingest, with the embed-only floor interleaved chunk by chunk ---
            ingest_s = floor_s = 0.0
            floor_n = 0
            for start in range(0, n, INGEST_CHUNK):
                chunk = items[start : start + INGEST_CHUNK]
                sample = rng.sample([it.prompt for it in chunk], min(FLOOR_SAMPLE_PER_CHUNK, len(chunk)))
                t = time.perf_counter()
                embedder.embed_documents(sample)
                floor_s += time.perf_counter() - t
                floor_n += len(sample)
                t = time.perf_counter()
                store.attempts.ingest(chunk)
                ingest_s += time.perf_counter() - t
                if (start // INGEST_CHUNK) % 5 == 4 or start + len(chunk) == n:
                    log(
                        f"[{n}] ingested {start + len(chunk)}/{n}: {(start + len(chunk)) / ingest_s:.0f}/s "
                        f"(embed-only {floor_n / floor_s:.0f}/s)"
                    )
            ingest_rate = n / ingest_s
            embed_rate = floor_n / floor_s

            # --- insights and tools of a realistic size ---
            for text in insight_texts(N_INSIGHTS, seed=n + 1):
                store.insights.add_insight(text, importance=rng.randint(1, 3))
            for name, description in tool_specs(N_TOOLS, seed=n + 2):
                store.tools.add_tool(
                    name, description=description, code_hash=f"{rng.getrandbits(64):016x}", origin="synthesized"
                )

            # --- latency: full context vs the floor, alternately, same queries ---
            for q in task_texts(10, seed=QUERY_SEED - 1):  # warm-up, not measured
                store.retrieval.context(q)
                store.index.query("trajectories", model.encode([q], normalize_embeddings=True)[0], 20)
            context_ms, floor_ms, sizes = [], [], []
            fetch = max(3 * options.candidates_per_result, 20)  # what context fetches per collection
            for i, q in enumerate(queries):

                def run_floor(q=q):
                    t = time.perf_counter()
                    v = model.encode([q], normalize_embeddings=True, convert_to_numpy=True)[0]
                    store.index.query("trajectories", v, fetch)
                    floor_ms.append((time.perf_counter() - t) * 1e3)

                def run_context(q=q):
                    t = time.perf_counter()
                    ctx = store.retrieval.context(q)
                    context_ms.append((time.perf_counter() - t) * 1e3)
                    sizes.append((len(ctx.trajectories), len(ctx.insights), len(ctx.tools)))

                first, second = (run_floor, run_context) if i % 2 == 0 else (run_context, run_floor)
                first()
                second()
            log(f"[{n}] context p95 {percentile(context_ms, 95):.1f} ms, floor p95 {percentile(floor_ms, 95):.1f} ms")

            # --- what pruning common words from the keyword search costs in quality ---
            keyword_quality = measure_keyword_pruning(store, queries[:100])

            # --- recall ---
            ids, matrix = stored_vectors(store, "trajectories")
            position = {i: p for p, i in enumerate(ids)}
            hnsw_hits = quant_hits = combined_hits = 0
            for q in queries:
                full = embedder.embed_query(q, full_precision=True)
                fast = embedder.embed_query(q)
                exact = top_k(matrix, full, 5)
                exact_set = set(exact.tolist())
                approx = {position[i] for i, _ in store.index.query("trajectories", full, 5)}
                hnsw_hits += len(approx & exact_set)
                quant_hits += len(set(top_k(matrix, fast, 5).tolist()) & exact_set)
                combined = {position[i] for i, _ in store.index.query("trajectories", fast, 5)}
                combined_hits += len(combined & exact_set)
            total = 5 * len(queries)
            recall = hnsw_hits / total
            quant_recall = quant_hits / total
            combined_recall = combined_hits / total
        finally:
            store.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)

    context_p95, floor_p95 = percentile(context_ms, 95), percentile(floor_ms, 95)
    result = {
        "trajectories": n,
        "distinct_texts": len(in_store),
        "insights": N_INSIGHTS,
        "tools": N_TOOLS,
        "queries": len(queries),
        "ingest_rate": round(ingest_rate, 1),
        "embed_only_rate": round(embed_rate, 1),
        "ingest_ratio": round(ingest_rate / embed_rate, 3),
        "context_p50_ms": round(percentile(context_ms, 50), 2),
        "context_p95_ms": round(context_p95, 2),
        "floor_p50_ms": round(percentile(floor_ms, 50), 2),
        "floor_p95_ms": round(floor_p95, 2),
        "context_ratio": round(context_p95 / floor_p95, 3),
        "context_mean_hits": [round(float(x), 2) for x in np.mean(np.asarray(sizes), axis=0)],
        "recall_at_5": round(recall, 4),
        "fast_query_recall_at_5": round(quant_recall, 4),
        "fast_query_hnsw_recall_at_5": round(combined_recall, 4),
        "keyword_pruning": keyword_quality,
    }
    result["pass"] = {
        "ingest_ratio>=0.8": result["ingest_ratio"] >= 0.8,
        "context_ratio<=1.5": result["context_ratio"] <= 1.5,
        "recall_at_5>=0.95": recall >= 0.95,
        "fast_query_recall_at_5>=0.95": quant_recall >= 0.95,
    }
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="10000,100000", help="comma-separated store sizes")
    parser.add_argument("--queries", type=int, default=200, help="distinct queries per size")
    parser.add_argument("--out", help="also write the JSON here")
    parser.add_argument("--quick", action="store_true", help="a small smoke run (2000 trajectories, 50 queries)")
    args = parser.parse_args(argv)
    sizes = [2000] if args.quick else [int(s) for s in args.sizes.split(",") if s.strip()]
    n_queries = 50 if args.quick else args.queries

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    embedder = Embedder()
    options = StoreOptions()
    embedder.embed_documents(task_texts(64, seed=99))  # load and warm up the model
    embedder.embed_query("warm up the query path")
    report = {
        "benchmark": "memory",
        "model": embedder.model_id,
        "fast_queries": embedder.fast_queries,
        "options": options.__dict__ if hasattr(options, "__dict__") else {},
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "sizes": {},
    }
    for n in sizes:
        report["sizes"][str(n)] = bench_size(n, n_queries, embedder, options, log)
        log(json.dumps({str(n): report["sizes"][str(n)]}))
        if args.out:  # partial results survive a later size being cut short
            Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
