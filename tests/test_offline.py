"""Nothing the store does needs the network: proved in a network namespace with no network at all."""

from __future__ import annotations

import textwrap

import pytest
from _helpers import last_json, run_python, works

IN_A_WORLD_WITHOUT_NETWORK = textwrap.dedent("""
    import json, socket, sys, pathlib

    # First show there really is no network here.
    try:
        socket.create_connection(("1.1.1.1", 443), timeout=3)
        reachable = True
    except OSError:
        reachable = False
    try:
        socket.getaddrinfo("huggingface.co", 443)
        resolved = True
    except OSError:
        resolved = False

    from memory import Embedder, NewTrajectory, Store

    embedder = Embedder()
    store = Store.open(pathlib.Path(sys.argv[1]), embedder=embedder)
    ids = store.attempts.ingest([
        NewTrajectory(prompt="resize every png in a folder", final_answer="mogrify -resize 50%", success=True),
        NewTrajectory(prompt="count the lines of a csv file", final_answer="wc -l", success=True),
        NewTrajectory(prompt="rotate the nginx logs weekly", final_answer="logrotate", success=False),
    ])
    hits = store.retrieval.search_trajectories("shrink the images in a directory", k=2)
    insight = store.insights.add_insight("check the file type before converting")
    context = store.retrieval.context("make thumbnails from pictures")
    query = embedder.embed_query("an offline query")
    docs = embedder.embed_documents(["an offline document"])
    store.close()
    print(json.dumps({
        "reachable": reachable, "resolved": resolved, "ids": ids,
        "top": hits[0].prompt, "top_similarity": hits[0].similarity,
        "indexed": len(ids), "context_insights": [h.text for h in context.insights],
        "query_dims": int(query.shape[0]), "doc_shape": list(docs.shape),
    }))
""")


def test_store_embeds_indexes_and_searches_with_no_network(tmp_path):
    if not works("unshare", "-n", "true"):
        pytest.skip("`unshare -n` (a network namespace) is not available here, e.g. without root")
    # Even a shell that asks the libraries to go online must not make them try.
    env = {"HF_HUB_OFFLINE": "0", "TRANSFORMERS_OFFLINE": "0", "ANONYMIZED_TELEMETRY": "True"}
    proc = run_python(
        IN_A_WORLD_WITHOUT_NETWORK, str(tmp_path / "data"), prefix=["unshare", "-n"], env=env, timeout=240
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = last_json(proc)
    assert result["reachable"] is False and result["resolved"] is False
    assert len(result["ids"]) == 3
    assert result["top"] == "resize every png in a folder"
    assert result["top_similarity"] > 0.3
    assert result["context_insights"] == ["check the file type before converting"]
    assert result["query_dims"] == 384 and result["doc_shape"] == [1, 384]


def test_importing_memory_forces_offline_settings():
    """A stray ``HF_HUB_OFFLINE=0`` in a user's shell must not let a library go online."""
    code = f"import json, os, memory; print(json.dumps({{k: os.environ[k] for k in {list(FORCED)!r}}}))"
    proc = run_python(
        code,
        env={
            "HF_HUB_OFFLINE": "0",
            "TRANSFORMERS_OFFLINE": "0",
            "ANONYMIZED_TELEMETRY": "True",
            "LITELLM_LOCAL_MODEL_COST_MAP": "False",
        },
    )
    assert proc.returncode == 0, proc.stderr
    assert last_json(proc) == FORCED


FORCED = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "ANONYMIZED_TELEMETRY": "False",
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
}


def test_chroma_never_embeds_text_itself(store):
    """The index refuses to embed (Chroma's default would download a model)."""
    collection = store.index._client.get_collection("trajectories")
    with pytest.raises(Exception, match="embeddings explicitly"):
        store.index._collections["trajectories"].add(ids=["x"], documents=["some text"])
    assert collection.count() == 0
