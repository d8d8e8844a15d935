"""MCP, the Model Context Protocol, both ways.

``serve``: `evolver mcp serve`, evolver's memory, insights, task inbox and
learned tools offered to other agents (a client of the daemon's socket, as the
CLI is).

Imports: the official ``mcp`` SDK; of evolver, nothing of the service or the
API (it talks to the daemon over its socket); ``evolver.cli`` imports it.
"""
