"""A stand-in for llama.cpp's ``llama-server`` in the fast tier: the same command line, /health, the key from
``--api-key-file`` (401 without it) and an OpenAI chat completion whose text says what it was asked, so the
supervision of [model] local is tested without a model. Run by a shell wrapper the tests write."""

from __future__ import annotations

import argparse
import json
import os
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def main() -> None:
    parser = argparse.ArgumentParser()
    for flag in ("--model", "--alias", "--ctx-size", "--parallel", "--threads", "--threads-batch", "--host"):
        parser.add_argument(flag)
    parser.add_argument("--port", type=int)
    parser.add_argument("--api-key-file")
    parser.add_argument("--kv-unified", action="store_true")
    parser.add_argument("--no-webui", action="store_true")
    parser.add_argument("--metrics", action="store_true")
    args = parser.parse_args()
    with open(args.api_key_file, encoding="utf-8") as f:
        keys = {line.strip() for line in f if line.strip() and not line.startswith("#")}
    print(f"fake llama-server pid {os.getpid()}: {args.alias} x{args.parallel} ctx {args.ctx_size}", flush=True)

    class Handler(BaseHTTPRequestHandler):
        def _send(self, status: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            if self.path == "/health":
                self._send(200, {"status": "ok"})
            else:
                self._send(404, {"error": "not found"})

        def do_POST(self) -> None:  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            if self.headers.get("Authorization", "").removeprefix("Bearer ") not in keys:
                self._send(401, {"error": {"message": "Invalid API Key", "type": "authentication_error"}})
                return
            asked = body["messages"][-1]["content"]
            self._send(
                200,
                {
                    "id": "fake",
                    "object": "chat.completion",
                    "created": 0,
                    "model": args.alias,
                    "choices": [
                        {
                            "index": 0,
                            "finish_reason": "stop",
                            "message": {"role": "assistant", "content": f"ok: {asked}"},
                        }
                    ],
                    "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
                },
            )

        def log_message(self, *_args) -> None:
            pass

    ThreadingHTTPServer((args.host, args.port), Handler).serve_forever()


if __name__ == "__main__":
    sys.exit(main())
