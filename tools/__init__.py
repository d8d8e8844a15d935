"""Tool specs, the tool registry, built-in tools and loading synthesized tools.

Empty until the agent lands (issue: the agent that solves tasks); it depends
only on ``sandbox``, where every tool runs.
"""

__all__: list[str] = []
