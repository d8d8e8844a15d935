"""Task families: recurring workstation work, each instance with fresh data and its right answer computed here.

A family is one kind of work a person hands over again and again: a count from a log, a total from a
CSV, a date some days on, a loan payment, files to rename. Each generator below takes a seeded
``random.Random`` and returns one instance: the task as a person would write it (its words vary
between instances, as a person's do), the files it comes with, the check that judges it, and the
right outcome with the classic wrong ones, computed by code from the data it generated, never by a
model. ``tests/test_families.py`` runs every family's right outcome through its check (it must pass)
and its classic mistakes (each must fail).

``family_pack(seed, per_family)`` is the bundled pack ``families`` (``resolve_pack("families")``):
``per_family`` instances of each family, the same for the same seed, each naming its family in the
pack format's ``family`` field. Nothing here is shown to the agent or a learner: they see a task's
words and files, as they would a person's.
"""

from __future__ import annotations

import calendar
import datetime as dt
import json
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from .checks import parse_check
from .taskpack import PackTask, hashed_split

__all__ = ["FAMILIES", "Instance", "Outcome", "family_instances", "family_pack"]

PER_FAMILY = 24
"""Instances of each family in the bundled pack: enough for a learning curve's training, promotion and
measured tasks (about 10 measured per family, 100 over ten families and more)."""
TEST_SHARE = 0.25  # the pack's own "test" split, for `evolver bench families` (the learning curve makes its own)


@dataclass(frozen=True)
class Outcome:
    """What an attempt leaves: its final answer, and the workspace's files after it (None: as given)."""

    answer: str | None = None
    workspace: dict[str, str] | None = None
    why: str = ""  # for a classic mistake: what is wrong with it


@dataclass(frozen=True)
class Instance:
    task: PackTask
    right: Outcome
    mistakes: tuple[Outcome, ...] = ()


@dataclass(frozen=True)
class _Made:
    """What a generator returns; ``family_instances`` gives it an id, a family and a split."""

    prompt: str
    check: dict
    right: Outcome
    mistakes: tuple[Outcome, ...]
    files: dict[str, str] = field(default_factory=dict)


def _numeric(value: float, places: int, tolerance: float | None = None) -> dict:
    return {
        "type": "answer",
        "expected": f"{value:.{places}f}",
        "match": "numeric",
        "tolerance": tolerance if tolerance is not None else 0.5 * 10**-places + 1e-9,
    }


def _count(value: int) -> dict:
    return {"type": "answer", "expected": str(value), "match": "numeric", "tolerance": 0}


def _wrong(answer: object, why: str, places: int | None = None) -> Outcome:
    text = f"{answer:.{places}f}" if places is not None else str(answer)
    return Outcome(answer=text, why=why)


def _misses(right: float, places: int, *wrong: tuple[float, str]) -> tuple[Outcome, ...]:
    """The classic mistakes that give another answer than the right one at ``places`` decimals (on some
    data a mistake happens to come out right, and is no mistake there)."""
    return tuple(_wrong(v, why, places) for v, why in wrong if abs(v - right) > 2 * 10**-places)


def _day(rng: random.Random, start: int = 2024, end: int = 2027) -> dt.date:
    first = dt.date(start, 1, 1)
    return first + dt.timedelta(days=rng.randrange((dt.date(end, 12, 31) - first).days))


# --- answers from files -------------------------------------------------------------------------

_SERVICES = ("payments", "auth", "search", "billing", "mailer", "reports")
_LEVELS = ("INFO", "INFO", "INFO", "WARN", "ERROR", "DEBUG")
_EVENTS = ("request done", "timeout talking to db", "retrying", "cache miss", "user logged in", "queue full")


def log_errors(rng: random.Random) -> _Made:
    service = rng.choice(_SERVICES)
    start = dt.datetime.combine(_day(rng), dt.time(8, 0))
    lines: list[str] = []
    per: Counter[tuple[str, str]] = Counter()
    for n in range(rng.randint(25, 45)):
        svc = service if rng.random() < 0.35 else rng.choice(_SERVICES)
        level = rng.choice(_LEVELS)
        at = start + dt.timedelta(seconds=37 * n + rng.randrange(30))
        lines.append(f"{at:%Y-%m-%dT%H:%M:%S} {level:<5} {svc}: {rng.choice(_EVENTS)}")
        per[(svc, level)] += 1
    if per[(service, "ERROR")] == 0:  # at least one, so a reply of 0 is not right by luck
        lines[rng.randrange(len(lines))] = f"{start:%Y-%m-%dT%H:%M:%S} ERROR {service}: timeout talking to db"
        per = Counter((ln.split()[2].rstrip(":"), ln.split()[1]) for ln in lines)
    right = per[(service, "ERROR")]
    every_error = sum(v for (s, lv), v in per.items() if lv == "ERROR")
    of_service = sum(v for (s, _), v in per.items() if s == service)
    prompt = rng.choice(
        (
            f"How many ERROR lines from the {service} service are in app.log? Just the count.",
            f"Can you count the errors the {service} service logged in app.log? A number is enough.",
            f"app.log is today's log. How many times did {service} log an ERROR?",
        )
    )
    mistakes = tuple(
        _wrong(v, why)
        for v, why in ((every_error, "every service's errors"), (of_service, "every line of the service"))
        if v != right
    )
    return _Made(prompt, _count(right), Outcome(str(right)), mistakes, {"app.log": "\n".join(lines) + "\n"})


_REGIONS = ("North", "South", "East", "West")
_PRODUCTS = ("widget", "gadget", "sprocket", "gizmo")


def csv_total(rng: random.Random) -> _Made:
    region = rng.choice(_REGIONS)
    rows, total, grand = [], 0.0, 0.0
    for _ in range(rng.randint(12, 24)):
        r = region if rng.random() < 0.4 else rng.choice(_REGIONS)
        amount = round(rng.uniform(5, 900), 2)
        rows.append(f"{_day(rng):%Y-%m-%d},{r},{rng.choice(_PRODUCTS)},{amount:.2f}")
        grand += amount
        total += amount if r == region else 0.0
    if total == 0.0:
        amount = round(rng.uniform(5, 900), 2)
        rows.append(f"{_day(rng):%Y-%m-%d},{region},widget,{amount:.2f}")
        total, grand = amount, grand + amount
    first_rows = sum(float(row.split(",")[3]) for row in rows[:-1] if row.split(",")[1] == region)
    prompt = rng.choice(
        (
            f"What's the total amount for the {region} region in sales.csv? Round to cents.",
            f"Add up the {region} sales in sales.csv for me: the amount column, to two decimals.",
            f"sales.csv has this quarter's orders. How much did {region} sell in total?",
        )
    )
    mistakes = _misses(total, 2, (grand, "every region's total"), (first_rows, "the last row left out"))
    files = {"sales.csv": "date,region,product,amount\n" + "\n".join(rows) + "\n"}
    return _Made(prompt, _numeric(total, 2), Outcome(f"{total:.2f}"), mistakes, files)


_CITIES = ("Oslo", "Lyon", "Porto", "Graz", "Turku")
_NAMES = ("Ana", "Ben", "Chen", "Dara", "Eli", "Fay", "Gus", "Hana", "Ivo", "Jo", "Kai", "Lea", "Max", "Noor")


def json_count(rng: random.Random) -> _Made:
    city, age = rng.choice(_CITIES), rng.randrange(25, 55, 5)
    people: list[dict] = [
        {"name": f"{rng.choice(_NAMES)} {chr(65 + n % 26)}.", "age": rng.randint(18, 70), "city": rng.choice(_CITIES)}
        for n in range(rng.randint(14, 26))
    ]
    people.insert(rng.randrange(len(people)), {"name": "Sam Q.", "age": age, "city": city})  # exactly the age
    people.insert(rng.randrange(len(people)), {"name": "Ola R.", "age": age + 7, "city": city})  # at least one
    right = sum(p["age"] > age and p["city"] == city for p in people)
    at_least = sum(p["age"] >= age and p["city"] == city for p in people)
    everywhere = sum(p["age"] > age for p in people)
    prompt = rng.choice(
        (
            f"How many people in people.json are older than {age} and live in {city}?",
            f"From people.json: count the {city} residents over {age}. Just the number.",
        )
    )
    mistakes = tuple(
        _wrong(v, why) for v, why in ((at_least, f"{age} itself counted"), (everywhere, "every city")) if v != right
    )
    return _Made(prompt, _count(right), Outcome(str(right)), mistakes, {"people.json": json.dumps(people, indent=1)})


def timesheet_hours(rng: random.Random) -> _Made:
    rows, minutes, whole_hours = [], 0, 0
    day = _day(rng)
    for n in range(rng.randint(4, 9)):
        start = dt.datetime.combine(day + dt.timedelta(days=n), dt.time(rng.randint(7, 10), rng.randrange(0, 60, 5)))
        end = start + dt.timedelta(minutes=rng.randrange(180, 560, 5))
        rows.append(f"{start:%Y-%m-%d},{start:%H:%M},{end:%H:%M}")
        minutes += (end - start).seconds // 60
        whole_hours += end.hour - start.hour
    hours = minutes / 60
    prompt = rng.choice(
        (
            "How many hours did I work in total according to timesheet.csv? Two decimals, please.",
            "Total up my hours in timesheet.csv (start and end times per day). Give the hours to 2 decimals.",
        )
    )
    as_clock = minutes // 60 + minutes % 60 / 100  # 7 h 30 written 7.30
    mistakes = _misses(
        hours, 2, (as_clock, "hours and minutes read as a decimal"), (whole_hours, "the minutes ignored")
    )
    files = {"timesheet.csv": "date,start,end\n" + "\n".join(rows) + "\n"}
    return _Made(prompt, _numeric(hours, 2), Outcome(f"{hours:.2f}"), mistakes, files)


_CURRENCIES = ("EUR", "GBP", "JPY", "CHF", "SEK", "CAD")


def currency(rng: random.Random) -> _Made:
    rates = {c: round(rng.uniform(0.6, 1.6), 4) if c != "JPY" else round(rng.uniform(130, 160), 2) for c in _CURRENCIES}
    source, target = rng.sample(_CURRENCIES, 2)
    amount = rng.choice((50, 120, 250, 480, 1000, 75.5, 1999.99))
    right = amount / rates[source] * rates[target]
    prompt = rng.choice(
        (
            f"Using the rates in rates.json, how much is {amount} {source} in {target}? Round to 2 decimals.",
            f"Convert {amount} {source} to {target} with rates.json. Two decimal places.",
        )
    )
    mistakes = _misses(
        right,
        2,
        (amount * rates[source] / rates[target], "the rates turned the wrong way"),
        (amount * rates[target], "the source currency taken as dollars"),
    )
    files = {"rates.json": json.dumps({"base": "USD", "note": "units of each currency per 1 USD", "rates": rates})}
    return _Made(prompt, _numeric(right, 2, tolerance=0.011), Outcome(f"{right:.2f}"), mistakes, files)


_WORDS = (
    "budget", "meeting", "server", "client", "report", "deadline", "invoice", "design", "release", "review",
    "backup", "ticket",
)  # fmt: skip


def top_word(rng: random.Random) -> _Made:
    words = rng.sample(_WORDS, 6)
    counts = sorted(rng.sample(range(2, 12), 6), reverse=True)  # distinct: one word is the most common
    bag = [w for w, c in zip(words, counts) for _ in range(c)]
    rng.shuffle(bag)
    lines, at = [], 0
    while at < len(bag):
        take = rng.randint(3, 7)
        chunk = [w.capitalize() if rng.random() < 0.3 else w for w in bag[at : at + take]]
        lines.append(" ".join(chunk) + rng.choice((".", ",", "!", "?", ";")))
        at += take
    prompt = rng.choice(
        (
            "Which word comes up most often in notes.txt, ignoring case? Just the word.",
            "What's the most frequent word in notes.txt (case doesn't matter)?",
        )
    )
    check = {"type": "answer", "expected": words[0], "match": "exact", "casefold": True}
    mistakes = (_wrong(words[1], "the second most common"), _wrong(words[-1], "the least common"))
    return _Made(prompt, check, Outcome(words[0]), mistakes, {"notes.txt": "\n".join(lines) + "\n"})


# --- answers from words -------------------------------------------------------------------------


def days_after(rng: random.Random) -> _Made:
    start, days = _day(rng), rng.randint(10, 400)
    right = start + dt.timedelta(days=days)
    prompt = rng.choice(
        (
            f"What's the date {days} days after {start:%B} {start.day}, {start.year}? Answer as YYYY-MM-DD.",
            f"If I start on {start.isoformat()}, what date is it {days} days later? Give it as YYYY-MM-DD.",
            f"My notice period is {days} days from {start:%d %B %Y}. On what date does it end (YYYY-MM-DD)?",
        )
    )
    check = {"type": "answer", "expected": right.isoformat(), "match": "exact"}
    mistakes = tuple(
        Outcome((right + dt.timedelta(days=d)).isoformat(), why=why) for d, why in ((-1, "one short"), (1, "one over"))
    )
    return _Made(prompt, check, Outcome(right.isoformat()), mistakes)


def weekday(rng: random.Random) -> _Made:
    day = _day(rng, 2020, 2030)
    right = calendar.day_name[day.weekday()]
    prompt = rng.choice(
        (
            f"What day of the week is {day.isoformat()}? Just the day's name.",
            f"Which weekday does {day:%B} {day.day}, {day.year} fall on?",
        )
    )
    check = {"type": "answer", "expected": right, "match": "exact", "casefold": True}
    mistakes = (
        Outcome(calendar.day_name[(day.weekday() + 1) % 7], why="the next day"),
        Outcome(calendar.day_name[(day.weekday() - 1) % 7], why="the day before"),
    )
    return _Made(prompt, check, Outcome(right), mistakes)


def loan_payment(rng: random.Random) -> _Made:
    principal = rng.randrange(5_000, 400_000, 500)
    rate, years = rng.choice((2.5, 3.1, 3.75, 4.2, 4.9, 5.5, 6.25, 7.0)), rng.choice((3, 5, 10, 15, 20, 25, 30))
    monthly, n = rate / 100 / 12, years * 12
    right = principal * monthly / (1 - (1 + monthly) ** -n)
    prompt = rng.choice(
        (
            f"I'm borrowing ${principal:,} at {rate}% a year, repaid monthly over {years} years. "
            "What's the monthly payment? Round to cents.",
            f"What would the monthly payment be on a {years}-year loan of {principal:,} dollars at {rate}% "
            "annual interest, compounded monthly? To the cent.",
        )
    )
    yearly = rate / 100
    mistakes = _misses(
        right,
        2,
        (principal * (1 + yearly * years) / n, "simple interest"),
        (principal * yearly / (1 - (1 + yearly) ** -n), "the yearly rate used per month"),
    )
    return _Made(prompt, _numeric(right, 2, tolerance=0.011), Outcome(f"{right:.2f}"), mistakes)


def percent_change(rng: random.Random) -> _Made:
    before = rng.randrange(200, 90_000, 10)
    after = before
    while abs(after - before) < 0.02 * before:  # a change worth asking about, whose sign is plain
        after = round(before * rng.uniform(0.4, 1.9) / 10) * 10
    right = (after - before) / before * 100
    what = rng.choice(("Revenue", "Monthly sign-ups", "Our electricity bill", "Traffic to the site"))
    prompt = rng.choice(
        (
            f"{what} went from {before:,} to {after:,}. What's the percentage change, to one decimal?",
            f"By what percent did it change? {what}: {before:,} last year, {after:,} this year. One decimal place, "
            "negative if it fell.",
        )
    )
    mistakes = _misses(
        right, 1, ((after - before) / after * 100, "divided by the new value"), (-right, "the sign flipped")
    )
    return _Made(prompt, _numeric(right, 1, tolerance=0.051), Outcome(f"{right:.1f}"), mistakes)


# --- files to write or reorganise ---------------------------------------------------------------

_FILE_CHECK = """import os

EXPECTED = {expected!r}
GONE = {gone!r}


def check(answer, workspace):
    for path, text in EXPECTED.items():
        try:
            with open(os.path.join(workspace, path), encoding="utf-8") as f:
                found = f.read()
        except OSError:
            return False, f"{{path}} is not there"
        if {compare}:
            return False, f"{{path}} does not hold what was asked for"
    for path in GONE:
        if os.path.exists(os.path.join(workspace, path)):
            return False, f"{{path}} should no longer be there"
    return True, "the files are as asked"
"""


def _file_check(expected: dict[str, str], gone: tuple[str, ...] = (), lines: bool = False) -> dict:
    """A Python check that the workspace holds ``expected`` (as text, or line by line ignoring a trailing
    newline and blank lines) and not ``gone``. The expected texts live in the check, which an attempt cannot
    read."""
    compare = (
        "[ln.strip() for ln in found.splitlines() if ln.strip()] != "
        "[ln.strip() for ln in text.splitlines() if ln.strip()]"
        if lines
        else "found != text"
    )
    return {"type": "python", "code": _FILE_CHECK.format(expected=expected, gone=list(gone), compare=compare)}


_DOMAINS = ("example.com", "mail.test", "corp.example", "uni.example")


def extract_emails(rng: random.Random) -> _Made:
    people = rng.sample(_NAMES, rng.randint(4, 8))
    addresses = [f"{name.lower()}.{rng.choice('abcdefghij')}@{rng.choice(_DOMAINS)}" for name in people]
    mentions = addresses + rng.sample(addresses, 2)  # two written twice
    rng.shuffle(mentions)
    lines = [
        rng.choice(("Met {n} at the fair, reach them at {a}.", "{n} <{a}>", "cc: {a} ({n})", "{n} - {a} - call first"))
        .replace("{n}", address.split(".")[0].capitalize())
        .replace("{a}", address)
        for address in mentions
    ]
    lines.insert(rng.randrange(len(lines)), "Office phone: +1 555 0100, no email.")
    right = "\n".join(sorted(set(addresses))) + "\n"
    prompt = rng.choice(
        (
            "Pull every email address out of contacts.txt into emails.txt: one per line, sorted, no duplicates.",
            "Please make emails.txt from contacts.txt: the unique addresses, one per line, in alphabetical order.",
        )
    )
    with_repeats = "\n".join(sorted(mentions)) + "\n"
    unsorted = "\n".join(dict.fromkeys(mentions)) + "\n"
    contacts = "\n".join(lines) + "\n"
    mistakes = [Outcome(workspace={"contacts.txt": contacts, "emails.txt": with_repeats}, why="duplicates kept")]
    if unsorted != right:
        mistakes.append(Outcome(workspace={"contacts.txt": contacts, "emails.txt": unsorted}, why="not sorted"))
    right_files = {"contacts.txt": contacts, "emails.txt": right}
    return _Made(
        prompt,
        _file_check({"emails.txt": right}, lines=True),
        Outcome(workspace=right_files),
        tuple(mistakes),
        {"contacts.txt": contacts},
    )


def rename_photos(rng: random.Random) -> _Made:
    day = _day(rng)
    files, renamed, no_seconds = {}, {}, {}
    stamps = sorted(
        {dt.datetime.combine(day, dt.time(rng.randint(6, 21), rng.randrange(60), rng.randrange(60))) for _ in range(5)}
    )
    for n, at in enumerate(stamps):
        original = f"photos/IMG_{at:%Y%m%d_%H%M%S}.jpg"
        files[original] = f"jpeg bytes of photo {n} ({rng.randrange(10**6)})\n"
        renamed[f"photos/{at:%Y-%m-%d_%H-%M-%S}.jpg"] = files[original]
        no_seconds[f"photos/{at:%Y-%m-%d_%H-%M}.jpg"] = files[original]
    prompt = rng.choice(
        (
            "The camera names photos like photos/IMG_20240314_101502.jpg. Rename every photo in photos/ to the form "
            "2024-03-14_10-15-02.jpg (its own date and time), in the same folder.",
            "Could you rename the pictures in photos/ from IMG_YYYYMMDD_HHMMSS.jpg to YYYY-MM-DD_HH-MM-SS.jpg? Keep "
            "them in photos/.",
        )
    )
    mistakes = (
        Outcome(workspace={**files, **renamed}, why="copied, the originals left behind"),
        Outcome(workspace=no_seconds, why="the seconds dropped"),
    )
    return _Made(prompt, _file_check(renamed, tuple(files)), Outcome(workspace=renamed), mistakes, files)


_STATUSES = ("shipped", "shipped", "refunded", "pending", "cancelled")


def csv_filter(rng: random.Random) -> _Made:
    status = rng.choice(("refunded", "pending", "cancelled"))
    header = "order_id,customer,total,status"
    rows = []
    for n in range(rng.randint(10, 20)):
        row_status = status if rng.random() < 0.3 else rng.choice(_STATUSES)
        rows.append(f"{1000 + n},{rng.choice(_NAMES)},{rng.uniform(5, 300):.2f},{row_status}")
    if not any(r.endswith("," + status) for r in rows):
        rows[rng.randrange(len(rows))] = f"1999,Ana,12.00,{status}"
    kept = [r for r in rows if r.endswith("," + status)]
    orders = header + "\n" + "\n".join(rows) + "\n"
    right = header + "\n" + "\n".join(kept) + "\n"
    out = f"{status}.csv"
    prompt = rng.choice(
        (
            f"Write the rows of orders.csv whose status is {status} to {out}, header line included.",
            f"I need a {out} with just the {status} orders from orders.csv (keep the header row).",
        )
    )
    mistakes = (
        Outcome(workspace={"orders.csv": orders, out: "\n".join(kept) + "\n"}, why="the header left out"),
        Outcome(workspace={"orders.csv": orders, out: orders}, why="every row kept"),
    )
    return _Made(
        prompt,
        _file_check({out: right}, lines=True),
        Outcome(workspace={"orders.csv": orders, out: right}),
        mistakes,
        {"orders.csv": orders},
    )


FAMILIES: dict[str, Callable[[random.Random], _Made]] = {
    "log-errors": log_errors,
    "csv-total": csv_total,
    "json-count": json_count,
    "timesheet-hours": timesheet_hours,
    "currency": currency,
    "top-word": top_word,
    "days-after": days_after,
    "weekday": weekday,
    "loan-payment": loan_payment,
    "percent-change": percent_change,
    "extract-emails": extract_emails,
    "rename-photos": rename_photos,
    "csv-filter": csv_filter,
}
"""The bundled families by name; each generator is deterministic in the ``random.Random`` it is given."""


def family_instances(seed: int = 0, per_family: int = PER_FAMILY) -> list[Instance]:
    """``per_family`` instances of each family, with their right outcomes and classic mistakes."""
    instances = []
    for name, generate in FAMILIES.items():
        for number in range(per_family):
            made = generate(random.Random(f"{seed}:{name}:{number}"))
            task_id = f"{name}-{number:03d}" if seed == 0 else f"{name}-s{seed}-{number:03d}"
            task = PackTask(
                id=task_id,
                prompt=made.prompt,
                check=parse_check(made.check),
                tags=("family",),
                split=hashed_split(task_id, TEST_SHARE),
                files=dict(made.files),
                family=name,
            )
            instances.append(Instance(task, made.right, made.mistakes))
    return instances


def family_pack(seed: int = 0, per_family: int = PER_FAMILY) -> list[PackTask]:
    """The bundled pack ``families``: its tasks, without their answers."""
    return [i.task for i in family_instances(seed, per_family)]
