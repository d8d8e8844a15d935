"""Realistic, deterministic task texts for memory benchmarks.

The texts look like what people hand a coding and data agent: one to three
sentences built from templates over many verbs, objects, file types, domains,
tools and constraints, so that 100k of them are almost all distinct and a
vector index over them has the clustered-but-varied shape real task logs have.
The same seed always yields the same texts; a different seed yields new ones
from the same distribution (the benchmark's queries).
"""

from __future__ import annotations

import random
from collections.abc import Iterator

__all__ = ["TaskTextGenerator", "task_texts", "answer_for", "insight_texts", "tool_specs"]

DOMAINS = [
    "billing",
    "checkout",
    "user accounts",
    "inventory",
    "shipping",
    "analytics",
    "search",
    "notifications",
    "payments",
    "authentication",
    "reporting",
    "the recommendation engine",
    "the data warehouse",
    "the mobile backend",
    "the admin dashboard",
    "customer support",
    "fraud detection",
    "the ETL pipeline",
    "the CI pipeline",
    "the feature store",
    "logging",
    "the pricing service",
    "subscriptions",
    "onboarding",
    "the chat service",
    "the scheduler",
    "the document store",
    "image processing",
    "the geocoding service",
    "marketing emails",
    "the payroll system",
    "clinical trials data",
    "sensor telemetry",
    "the trading engine",
    "the game server",
    "the CMS",
    "translations",
    "the weather model",
    "the crawler",
]

LANGUAGES = ["Python", "TypeScript", "Go", "Rust", "Java", "SQL", "Bash", "C++", "Kotlin", "Ruby"]

FILE_KINDS = [
    ("CSV", "csv"),
    ("JSON", "json"),
    ("Parquet", "parquet"),
    ("YAML", "yaml"),
    ("Excel", "xlsx"),
    ("log", "log"),
    ("XML", "xml"),
    ("Markdown", "md"),
    ("SQLite", "db"),
    ("JSON Lines", "jsonl"),
    ("TOML", "toml"),
    ("HTML", "html"),
    ("PDF", "pdf"),
    ("protobuf", "proto"),
    ("Avro", "avro"),
]

FILE_STEMS = [
    "orders",
    "users",
    "events",
    "transactions",
    "config",
    "metrics",
    "inventory",
    "customers",
    "sessions",
    "invoices",
    "products",
    "access",
    "errors",
    "sales_2023",
    "survey_results",
    "sensor_readings",
    "deployments",
    "tickets",
    "payroll",
    "clicks",
    "shipments",
    "reviews",
    "experiments",
    "schema",
    "settings",
    "audit",
    "leads",
    "prices",
    "routes",
    "patients",
]

CODE_OBJECTS = [
    "the retry logic",
    "the database connection pool",
    "the caching layer",
    "the REST client",
    "the date parsing helper",
    "the pagination code",
    "the CLI argument parser",
    "the rate limiter",
    "the config loader",
    "the authentication middleware",
    "the background job runner",
    "the CSV exporter",
    "the webhook handler",
    "the search indexer",
    "the session manager",
    "the serialization code",
    "the migration scripts",
    "the logging setup",
    "the test fixtures",
    "the error handling",
    "the GraphQL resolvers",
    "the file upload endpoint",
    "the cron jobs",
    "the feature flag checks",
    "the email templates",
    "the queue consumer",
    "the ORM models",
    "the permission checks",
    "the currency conversion",
    "the timezone handling",
]

BUGS = [
    "throws a KeyError on empty input",
    "leaks file handles under load",
    "deadlocks when two workers start at once",
    "returns stale results after an update",
    "is off by one at month boundaries",
    "crashes on non-ASCII names",
    "times out on large payloads",
    "double-counts refunded orders",
    "silently drops rows with null ids",
    "fails only on Windows paths",
    "uses 4 GB of memory on a 200 MB file",
    "loses precision on large decimals",
    "ignores the configured timeout",
    "breaks when the header row is missing",
    "retries forever on 404",
    "mixes up UTC and local time",
    "returns 500 instead of 400 for bad input",
    "is flaky in CI about one run in ten",
]

ANALYSES = [
    "the monthly revenue by region",
    "the churn rate per cohort",
    "the p95 latency per endpoint",
    "the top 20 customers by lifetime value",
    "the weekly active users",
    "the conversion funnel",
    "the correlation between price and demand",
    "the distribution of order sizes",
    "the error rate per release",
    "the average resolution time per ticket category",
    "outliers in the sensor readings",
    "the seasonal trend in sales",
    "duplicate records",
    "the share of failed payments by card type",
    "the retention curve",
    "the most common search queries",
    "the cost per acquisition by channel",
]

OUTPUTS = [
    "a bar chart saved as PNG",
    "a short Markdown report",
    "a CSV summary",
    "a JSON file",
    "an HTML table",
    "a pivot table",
    "a line plot",
    "a one-paragraph summary",
    "a Jupyter notebook",
    "a Slack-ready message",
    "a SQL view",
    "a dashboard panel",
]

CONSTRAINTS = [
    "Keep the public API unchanged.",
    "Do not add new dependencies.",
    "It must stay under 100 ms per request.",
    "Add unit tests for the edge cases.",
    "Use only the standard library.",
    "Make it work with Python 3.9.",
    "Keep memory usage flat for files larger than RAM.",
    "Preserve the original row order.",
    "Write the result atomically.",
    "Log what was skipped and why.",
    "It has to be idempotent.",
    "Handle missing values explicitly.",
    "Don't touch the production database.",
    "Keep the diff small.",
    "Make it deterministic so CI is stable.",
    "Document the new flags in the README.",
    "Use type hints throughout.",
    "Respect the existing code style.",
    "Stream the input instead of loading it all.",
    "Fail with a clear error message on bad input.",
    "Make it safe to run concurrently.",
    "Support both gzip and plain input.",
    "The job must finish within 10 minutes.",
]

CONTEXTS = [
    "The team noticed this after last week's deploy.",
    "This blocks the quarterly report.",
    "A customer reported it twice already.",
    "We're migrating off the old system next month.",
    "The data comes from a third-party vendor and is messy.",
    "Performance regressed after the upgrade.",
    "This runs nightly in a cron job.",
    "It's for an internal audit.",
    "The on-call engineer flagged it.",
    "We only see it in staging.",
    "Legal asked for this before the release.",
    "",
    "",
    "",
    "",
]

TOOLS_USED = [
    "pandas",
    "polars",
    "numpy",
    "SQLAlchemy",
    "requests",
    "httpx",
    "asyncio",
    "pytest",
    "Docker",
    "Kubernetes",
    "Terraform",
    "Airflow",
    "Spark",
    "DuckDB",
    "PostgreSQL",
    "Redis",
    "Kafka",
    "FastAPI",
    "Django",
    "Flask",
    "React",
    "git",
    "GitHub Actions",
    "matplotlib",
    "scikit-learn",
    "BeautifulSoup",
    "Celery",
    "Elasticsearch",
    "S3",
    "BigQuery",
    "jq",
    "awk",
    "ffmpeg",
]

REFACTORS = [
    "split it into smaller functions",
    "replace the global state with dependency injection",
    "convert the callbacks to async/await",
    "remove the duplicated validation code",
    "move the SQL into a repository class",
    "replace the hand-rolled parser with {tool}",
    "make the configuration come from environment variables",
    "add proper type hints",
    "turn the script into a reusable module",
    "replace print statements with structured logging",
]

TEMPLATES = [
    "Fix the bug in {code_object} of {domain}: it {bug}. {constraint}",
    "{code_object_cap} in {domain} {bug}. Find the cause and fix it. {context} {constraint}",
    "Load {stem}.{ext} ({file_kind}) and compute {analysis}. Output {output}.",
    "Using {tool}, compute {analysis} from the {file_kind} export in data/{stem}.{ext}. {constraint}",
    "Write a {language} script that converts {stem}.{ext} from {file_kind} to {file_kind2}. {constraint}",
    "Refactor {code_object} in {domain} and {refactor}. {constraint} {constraint2}",
    "Add a {language} function to {domain} that validates the {stem} records before import. {constraint}",
    "Write tests for {code_object} in {domain}; it {bug} and we need a regression test. {constraint}",
    "Set up {tool} for {domain} so that {code_object} runs in a container. {context}",
    "Profile {code_object} in {domain}: it is slow on large {file_kind} inputs. {constraint}",
    "Clean up the {stem} dataset: remove duplicates, normalise dates, and fill missing values. "
    "Save it as {file_kind2}.",
    "Migrate {code_object} of {domain} from {tool} to {tool2}. {constraint} {context}",
    "Summarise {analysis} for {domain} over the last quarter and produce {output}. {context}",
    "Write a SQL query over the {stem} table that returns {analysis}. {constraint}",
    "Our {domain} service {bug} when reading {stem}.{ext}. Investigate, fix it, and explain the root cause.",
    "Build a small {language} CLI that reads {file_kind} files like {stem}.{ext} and prints {analysis}. {constraint}",
    "Review {code_object} in {domain} for security problems and fix anything serious. {constraint}",
    "Scrape the {stem} pages with {tool}, extract the tables, and save them as {file_kind}. {constraint}",
    "Explain why {code_object} in {domain} {bug}, then propose a fix. {context}",
    "Create a {tool} job for {domain} that exports {stem} nightly to {file_kind}. {constraint} {constraint2}",
    "Add pagination and filtering to the {stem} endpoint of {domain}. {constraint}",
    "Plot {analysis} from {stem}.{ext} and produce {output}. {constraint}",
    "Rewrite {code_object} of {domain} in {language}. {constraint} {context}",
    "Detect anomalies in {stem}.{ext} ({file_kind}) using {tool} and report {analysis}. {context}",
]

ANSWERS = [
    "Done: the fix is in place and the tests pass.",
    "Implemented and verified on the sample data.",
    "Root cause found and patched; added a regression test.",
    "Report generated and saved.",
    "Refactored; behaviour unchanged, all checks green.",
    "Could not reproduce; added logging to narrow it down.",
    "Query written and checked against the expected totals.",
    "Converted all files; row counts match.",
]


def _cap(text: str) -> str:
    return text[:1].upper() + text[1:]


class TaskTextGenerator:
    """A seeded stream of task texts (deterministic for a seed)."""

    def __init__(self, seed: int = 0) -> None:
        self.rng = random.Random(seed)

    def one(self) -> str:
        r = self.rng
        kind, ext = r.choice(FILE_KINDS)
        kind2 = r.choice([k for k, _ in FILE_KINDS if k != kind])
        tool, tool2 = r.sample(TOOLS_USED, 2)
        c1, c2 = r.sample(CONSTRAINTS, 2)
        code_object = r.choice(CODE_OBJECTS)
        fields = {
            "domain": r.choice(DOMAINS),
            "language": r.choice(LANGUAGES),
            "file_kind": kind,
            "file_kind2": kind2,
            "ext": ext,
            "stem": r.choice(FILE_STEMS),
            "code_object": code_object,
            "code_object_cap": _cap(code_object),
            "bug": r.choice(BUGS),
            "analysis": r.choice(ANALYSES),
            "output": r.choice(OUTPUTS),
            "constraint": c1,
            "constraint2": c2,
            "context": r.choice(CONTEXTS),
            "tool": tool,
            "tool2": tool2,
        }
        fields["refactor"] = r.choice(REFACTORS).format(tool=tool)
        text = r.choice(TEMPLATES).format(**fields)
        # Real prompts carry small specifics: a ticket number, a date, a size.
        extra = r.random()
        if extra < 0.15:
            text += f" See ticket {r.choice(['ENG', 'DATA', 'OPS', 'SUP'])}-{r.randint(100, 9999)}."
        elif extra < 0.25:
            text += f" It concerns about {r.choice([2, 5, 10, 40, 120, 800])}k rows."
        elif extra < 0.32:
            text += f" Deadline is {r.choice(['Monday', 'Friday', 'end of sprint', 'tomorrow', 'the 15th'])}."
        return " ".join(text.split())

    def __iter__(self) -> Iterator[str]:
        while True:
            yield self.one()

    def take(self, n: int) -> list[str]:
        return [self.one() for _ in range(n)]


def task_texts(n: int, seed: int = 0) -> list[str]:
    return TaskTextGenerator(seed).take(n)


def answer_for(rng: random.Random) -> str:
    return rng.choice(ANSWERS)


def insight_texts(n: int, seed: int = 1) -> list[str]:
    """Lessons a meta-agent might distil from trajectories."""
    r = random.Random(seed)
    patterns = [
        "When {code_object} in {domain} {bug}, check the input encoding and the timezone first.",
        "For {file_kind} files larger than memory, stream with {tool} instead of loading everything.",
        "Before computing {analysis}, drop duplicate {stem} records; they skew the result.",
        "Tasks touching {domain} usually need the tests in tests/{stem}; run them before finishing.",
        "{tool} is faster than {tool2} for {analysis} on {file_kind} inputs.",
        "Always confirm the column names of {stem}.{ext} before writing a query; they change between exports.",
        "If a {language} job {bug}, add a regression test before fixing it.",
        "Prefer {output} when asked for {analysis}; reviewers read it faster.",
    ]
    out = []
    for _ in range(n):
        kind, ext = r.choice(FILE_KINDS)
        tool, tool2 = r.sample(TOOLS_USED, 2)
        out.append(
            r.choice(patterns).format(
                code_object=r.choice(CODE_OBJECTS),
                domain=r.choice(DOMAINS),
                bug=r.choice(BUGS),
                file_kind=kind,
                ext=ext,
                tool=tool,
                tool2=tool2,
                analysis=r.choice(ANALYSES),
                stem=r.choice(FILE_STEMS),
                language=r.choice(LANGUAGES),
                output=r.choice(OUTPUTS),
            )
        )
    return out


def tool_specs(n: int, seed: int = 2) -> list[tuple[str, str]]:
    """(name, description) pairs of synthesized tools."""
    r = random.Random(seed)
    verbs = ["convert", "validate", "summarise", "plot", "dedupe", "profile", "export", "parse", "diff", "sample"]
    out, seen = [], set()
    while len(out) < n:
        verb = r.choice(verbs)
        kind, ext = r.choice(FILE_KINDS)
        stem = r.choice(FILE_STEMS)
        name = f"{verb}_{stem}_{ext}"
        if name in seen:
            continue
        seen.add(name)
        out.append(
            (
                name,
                f"{_cap(verb)} {stem} data stored as {kind} ({ext}) files; "
                f"handles {r.choice(['large inputs', 'missing values', 'unicode', 'gzip input'])} "
                f"and reports {r.choice(ANALYSES)}.",
            )
        )
    return out
