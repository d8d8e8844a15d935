"""The daemon's HTTP API (an ASGI app), served over its Unix socket.

Routes live under ``/v1``: tasks and their live steps, OpenAI-compatible chat,
and inspection of memory, insights, tools, the tree and the evolution history.
Every error is a JSON body ``{"error": {"type", "message", "param"}}`` (the
shape OpenAI clients read) with a 4xx status that names the problem.

Imports: meta, tree, agent, judge, llm, config and memory; never the service:
it serves any ``ServiceHost`` (``host``), which the daemon keeps.
"""

from .app import create_app

__all__ = ["create_app"]
