"""Which agent serves a task: the one place that decides it, for the daemon and its worker processes.

The search's tasks (evaluations, smoke tasks) run on the scaffold of the node
they test; everything else on the incumbent's, read at each call so that a
promotion takes effect from the next task.
"""

from __future__ import annotations

import threading

from memory import Task

from ..agent.loop import Agent
from ..agent.scaffold import Scaffold
from ..engine import Engine
from ..tree.incumbent import incumbent, scaffold_of

__all__ = ["Agents"]


class Agents:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._served: tuple[str, Scaffold] | None = None  # the incumbent's scaffold, kept until it changes
        self._lock = threading.Lock()

    def __call__(self, task: Task | None = None) -> Agent:
        store = self.engine.store
        if task is not None and task.source.searched and task.metadata.get("node"):
            node = store.tree.get_node(task.metadata["node"])
            return self.engine.agent(scaffold_of(store, node), node_id=node.id)
        node = incumbent(store)
        with self._lock:
            if self._served is None or self._served[0] != node.id:
                self._served = (node.id, scaffold_of(store, node))
            scaffold = self._served[1]
        return self.engine.agent(scaffold, node_id=node.id)
