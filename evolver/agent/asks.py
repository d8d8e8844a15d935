"""What a task asks for, read from its words: the file and functions to deliver, and the answer's form.

People do not write a ``deliver`` field. They write "Write solution.py defining run_length(s)…", "I need
a function `parse(line)` in parser.py", "create report.py with a main()". So the agent reads the
deliverable from the text, exactly as if the field had been given (the field, when present, still wins:
``evolver.agent.loop``). A file the text names *to read* ("run check.py", "config.py in your workspace
defines RATE") is not asked for, and neither is a file the task itself puts in the workspace.

The answer's form comes from the same words: "Answer with the number only", "the weekday's English name
only", "rounded to the cent". The form shapes the last-answer turn's question and is checked before a
finish is taken (``AnswerForm.shape``). None of this is the judge: the check decides as before, and a
wrong reading only changes what the agent tries.
"""

from __future__ import annotations

import ast
import builtins
import re
import warnings
from dataclasses import dataclass

from ..judge.deliverable import Deliverable, parse_deliverable

__all__ = ["AnswerForm", "answer_form", "deliverable_in_words"]

# A Python file named in the text: a relative path of identifiers ending in .py.
_FILE = re.compile(r"(?<![\w/.\\-])((?:[A-Za-z_]\w*/)*[A-Za-z_]\w*\.py)(?![\w/])")
# A signature: a name and a parameter list (``f(x)``, ``parse(line: str)``, ``main()``).
_SIGNATURE = re.compile(r"(?<![\w.])([A-Za-z_]\w*)\(([^()]*)\)")
# A function named in words: "a function called slugify", "function `slugify`", "the `slugify` function".
_NAMED = re.compile(
    r"\bfunctions?\s+(?:called\s+|named\s+)?`?([A-Za-z_]\w*)`?|`([A-Za-z_]\w*)`\s+functions?\b", re.IGNORECASE
)
_WRITE = re.compile(
    r"\b(write|writes|create|make|put|add|implement|define|defining|defines|save|build|provide|give|need|"
    r"want|produce|generate|deliver|code up|save it (?:as|to|in))\b",
    re.IGNORECASE,
)
_READ = re.compile(
    r"\b(read|reads|open|load|run|execute|import|look at|inspect|given|existing|attached|provided|"
    r"in your workspace|in the workspace|is there|there is|has an?|contains|what does|what do)\b",
    re.IGNORECASE,
)
_NOT_FUNCTIONS = frozenset(dir(builtins)) | {"self", "cls"}
# Sentences end at ., ! or ? followed by a space (so "solution.py" and "3.5" stay whole) or at a newline.
_SENTENCES = re.compile(r"(?<=[.!?])\s+|\n+")


def _sentences(text: str) -> list[str]:
    return [s for s in _SENTENCES.split(text) if s.strip()]


def _parameters(text: str) -> bool:
    """Whether ``text`` reads as a parameter list (``x``, ``s: str``, ``xs, n=2``), not call arguments."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SyntaxWarning)
            ast.parse(f"def _({text}): pass")
    except SyntaxError:
        return False
    return True


def _signatures(sentence: str) -> list[str]:
    """The functions a sentence writes with a parameter list (``f(x)``; not ``f(2)``, which calls it)."""
    return [m[1] for m in _SIGNATURE.finditer(sentence) if _parameters(m[2]) and m[1] not in _NOT_FUNCTIONS]


def _functions(sentence: str) -> list[str]:
    found = _signatures(sentence)
    for m in _NAMED.finditer(sentence):
        name = m[1] or m[2]
        if name.lower() not in {"that", "which", "to", "in", "for", "of", "and", "or", "the", "a", "an", "called"}:
            found.append(name)
    return [f for f in found if f not in _NOT_FUNCTIONS and not f.endswith("_py")]


_DEFINING = re.compile(
    r"[`'\"]?\s*(?:,\s*)?(?:defining|that defines|which defines|to define|containing|that contains|with|"
    r"that has|exporting|providing)\b",
    re.IGNORECASE,
)


def _asked_file(sentence: str, given: set[str]) -> str | None:
    """The file a sentence asks to be written: followed by "defining", "with", "containing"…, or named
    after a writing word with no reading word between them ("run check.py" names a file to read)."""
    for match in _FILE.finditer(sentence):
        path = match[1]
        if path in given:
            continue
        before, after = sentence[: match.start()], sentence[match.end() :]
        if _DEFINING.match(after):
            return path
        if _READ.match(after.lstrip(" `'\"")):  # "config.py in your workspace defines …"
            continue
        writing = [m.end() for m in _WRITE.finditer(before)]
        reading = [m.end() for m in _READ.finditer(before)]
        if writing and (not reading or writing[-1] > reading[-1]):
            return path
        if not reading and not _READ.search(after) and (_WRITE.search(after) or _signatures(sentence)):
            return path  # "In solution.py, write …", "temps.py should have f(c)", "`f(n)` should go in f.py"
    return None


def deliverable_in_words(prompt: str, given_files: set[str] | frozenset[str] = frozenset()) -> Deliverable | None:
    """The file and functions the task's words ask to be written, or None when they ask for no function in
    a file (a script, an answer, a file to read). ``given_files`` are the task's own files: never asked for.
    """
    given = set(given_files)
    sentences = _sentences(prompt)
    for n, sentence in enumerate(sentences):
        path = _asked_file(sentence, given)
        if path is None:
            continue
        # the functions of the sentence that names the file, else of the sentences right after it
        functions: list[str] = []
        for other in sentences[n : n + 3]:
            functions = _functions(other)
            if functions:
                break
        if not functions:
            continue
        try:
            return parse_deliverable({"file": path, "functions": list(dict.fromkeys(functions))})
        except ValueError:
            continue
    return None


# --- the answer's form --------------------------------------------------------------------------------

_NUMBER = re.compile(r"[-+]?\$?\d[\d,]*(?:\.\d+)?|[-+]?\.\d+")
_WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
_DATE = re.compile(r"\b\d{4}-\d{2}-\d{2}\b")


@dataclass(frozen=True)
class AnswerForm:
    """The form a task asks its answer in: ``kind`` is number, cents, word, weekday or date."""

    kind: str
    words: str  # how the last-answer turn asks for it

    def shape(self, answer: str) -> tuple[str | None, str | None]:
        """The answer in this form, or None and why it is not one. A reply that holds exactly one answer of
        the form ("The total is $12.50.") is shaped to it; one that holds none, or several, is refused."""
        text = answer.strip()
        if self.kind in ("number", "cents"):
            found = [n for n in _NUMBER.findall(text.replace("\u2212", "-")) if any(c.isdigit() for c in n)]
            if len(set(found)) != 1:
                many = "several numbers" if found else "no number"
                return None, f"the task asks for {self.words}, and this answer holds {many}"
            value = found[0].replace("$", "").replace(",", "")
            if self.kind == "cents":
                try:
                    value = f"{float(value):.2f}"
                except ValueError:
                    return None, f"the task asks for {self.words}"
            return value, None
        if self.kind == "word":
            quoted = set(re.findall(r"[\"'`\u201c\u2018]([A-Za-z][\w-]*)[\"'`\u201d\u2019]", text))
            bare = text.strip(" .!\"'`*")
            if re.fullmatch(r"[A-Za-z][\w-]*", bare):
                return bare, None
            if len(quoted) == 1:  # 'The most frequent word is "backup".'
                return quoted.pop(), None
            return None, f"the task asks for {self.words}, and this answer is not one word"
        if self.kind == "weekday":
            days = {d for d in _WEEKDAYS if re.search(rf"\b{d}\b", text, re.IGNORECASE)}
            if len(days) != 1:
                return None, f"the task asks for {self.words}, and this answer names {len(days) or 'no'} weekdays"
            return days.pop(), None
        dates = set(_DATE.findall(text))
        if len(dates) != 1:
            return None, f"the task asks for {self.words}"
        return dates.pop(), None


def answer_form(prompt: str) -> AnswerForm | None:
    """The answer's form the task's words ask for, if they ask for one."""
    text = prompt.lower()
    if re.search(r"weekday|day of the week", text) and re.search(r"\bname\b|which day|what day|weekday", text):
        return AnswerForm("weekday", "the weekday's English name only (for example Tuesday)")
    if re.search(r"yyyy-mm-dd|iso (?:8601 )?(?:format|date)", text):
        return AnswerForm("date", "the date only, as YYYY-MM-DD")
    if re.search(r"to the (?:nearest )?cent|(?:round(?:ed)? )?to cents|(?:two|2) decimal(?:s| places)", text):
        return AnswerForm("cents", "the amount only, rounded to the cent (for example 12.50)")
    if re.search(
        r"(?:number|amount|figure|value|total|count|integer) only|only the (?:number|amount|total|count)|"
        r"just the (?:number|amount|total|count)|answer with (?:a|the) (?:number|amount|integer)|"
        r"\bhow (?:many|much)\b|\bcan you count\b|\bcount the\b|a number is enough|"
        r"\bby what percent|\bpercentage change\b|\bone decimal(?: place)?\b",
        text,
    ):
        return AnswerForm("number", "the number only")
    if re.search(r"just the word|the word only|which word|what word|most (?:frequent|common) word", text):
        return AnswerForm("word", "the word only")
    return None
