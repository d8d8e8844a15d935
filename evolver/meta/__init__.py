"""The meta-agent: background jobs that turn experience into improvements.

``jobs`` schedules the rounds; ``distill`` and ``insights`` keep the ranked
insight list; ``synthesize`` writes tools and puts them through quarantine;
``revert`` undoes an event's changes; ``packs`` exports what was learned and
imports another installation's, through the same checks.

Imports: ``tree`` (the incumbent, the search a job steps), ``agent``, ``llm``,
``evolver.config`` and ``memory``, ``tools``, ``sandbox``; never the service,
the API or the CLI: the daemon hands the jobs a ``JobHost``.
"""

from .jobs import Job, JobError, JobHost, JobRound, Jobs, builtin_jobs

__all__ = ["Job", "JobError", "JobHost", "JobRound", "Jobs", "builtin_jobs"]
