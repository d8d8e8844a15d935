"""Isolated execution of model-written code (bubblewrap, limits, timeouts).

Empty until the agent lands (issue: the agent that solves tasks); it depends
on no other package of the project.
"""

__all__: list[str] = []
