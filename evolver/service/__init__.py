"""The service: the daemon process and what runs inside it.

``daemon`` owns the store, binds the socket and acts on its mood; ``worker``
runs leased inbox tasks; ``intake`` group-commits submits; ``feed`` wakes the
readers of live steps; ``server`` runs uvicorn on sockets the daemon bound;
``sockets`` binds and probes them; ``systemd`` writes the user unit.

Imports: everything below it (api, meta, tree, agent, judge, llm); only the
CLI imports it. Nothing is re-exported here, so the CLI's socket probe does
not load the whole engine.
"""

__all__ = ["daemon", "worker", "intake", "feed", "server", "sockets", "systemd"]
