"""Check a llama-server build before trusting it: it loads the GGUF and generates a few tokens.

Usage: python3 scripts/check_llama_server.py LLAMA_SERVER MODEL.gguf
Standard library only (it runs before any venv exists). The server listens on a Unix socket in a private
temporary directory and is stopped afterwards, whatever happens.
"""

from __future__ import annotations

import http.client
import json
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("localhost", timeout=60)
        self.path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(60)
        self.sock.connect(self.path)


def _request(path: str, method: str, url: str, body: dict | None = None) -> tuple[int, dict]:
    conn = _UnixConnection(path)
    try:
        conn.request(method, url, body=json.dumps(body) if body else None, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, json.loads(response.read() or b"{}")
    finally:
        conn.close()


def main(binary: str, model: str) -> int:
    with tempfile.TemporaryDirectory(prefix="llama-check-") as tmp:
        sock, log = str(Path(tmp) / "server.sock"), Path(tmp) / "server.log"
        with open(log, "wb") as out:
            server = subprocess.Popen(
                [binary, "-m", model, "-c", "512", "-np", "1", "-t", "2", "--no-webui", "--host", sock],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        try:
            deadline = time.monotonic() + 120
            while True:
                if server.poll() is not None:
                    print(f"llama-server exited {server.returncode}:\n{log.read_text()[-3000:]}", file=sys.stderr)
                    return 1
                try:
                    if _request(sock, "GET", "/health")[0] == 200:
                        break
                except OSError:
                    pass
                if time.monotonic() > deadline:
                    print(f"llama-server was not ready within 120 s:\n{log.read_text()[-3000:]}", file=sys.stderr)
                    return 1
                time.sleep(0.3)
            status, reply = _request(
                sock, "POST", "/completion", {"prompt": "The capital of France is", "n_predict": 4, "temperature": 0}
            )
            if status != 200 or not reply.get("content"):
                print(f"llama-server did not generate ({status}): {reply}", file=sys.stderr)
                return 1
            print(f"llama-server loads the model and generates: {reply['content']!r}")
            return 0
        finally:
            server.terminate()
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python3 scripts/check_llama_server.py LLAMA_SERVER MODEL.gguf")
    sys.exit(main(sys.argv[1], sys.argv[2]))
