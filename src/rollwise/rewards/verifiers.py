"""Built-in reward functions, all with the signature ``fn(completion, item) -> float``.

Answer extraction (`extract_answer`), applied in this order:

1. the contents of the last ``<answer>...</answer>`` pair, if there is one;
2. else the contents of the last ``\\boxed{...}`` (nested braces are matched);
   a box that is the whole of the tag's contents (``<answer>\\boxed{12}</answer>``) and a ``\\text{...}``
   (``\\textbf``, ``\\mathrm``, ...) around the whole answer are taken off;
3. else the last non-empty line (or, when it is a sentence with neither a number nor an
   "answer" prefix, such as "I hope it is correct.", nor an answer named later in it by "the/my/final answer
   is" in at most eight words, "No wait, the answer is Rome", but not a remark such as "I hope the answer is
   correct!" or "Note: the answer is rounded to the nearest whole number.", the last line before it with one), with a
   leading "answer:"/"the answer is" (also as a markdown label, "**Answer**:", "### Answer:") and surrounding
   markdown/LaTeX decoration (``* $ `` and a
   final period) removed. If what is left has no whitespace it is the answer (``-4``, ``3/4``,
   ``x+2``); a list of numbers and nothing else (``0.0, 0.5238``, ``4.89 4.56``, after an "answer is" prefix or
   not) is the answer as a whole; otherwise the first number after an "answer is" prefix, or the number right after "answer is"
   later in the line (``The answer is 2, since 98 = 2 * 49`` and ``So the answer is 2, since ...`` give ``2``), else
   the last number in it (``The sum is 12.`` gives ``12``), or, when it holds no number, what follows a
   mid-line "the/my/final answer is" (``So the answer is Paris.`` gives ``Paris``; not a remark such as "I hope the
   answer is correct."), else the line itself. `exact_match` also compares the whole line with the gold
   answer, so a gold answer with words ("12 apples", "2, 3") matches the same line.

The result is stripped, and thousands separators are removed from a lone number
(``1,000`` becomes ``1000``). Tasks whose answers are not numbers should ask for
``<answer>`` tags in `data.instruction`.

Gold answers are used as they are, except that a GSM8K-style ``... #### 72`` keeps only
the part after the last ``####``.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import logging
import os
import re
import sys
from collections.abc import Callable
from fractions import Fraction
from functools import cache
from pathlib import Path
from typing import Any

from rollwise.config import ConfigError
from rollwise.types import PromptItem

RewardFn = Callable[[str, PromptItem], float]

FORMAT_MAX_CHARS = 32

_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
# a markdown heading or bold label counts as the prefix too: "### Answer: Paris", "**Answer**: Paris"
_PREFIX = re.compile(r"^(?:#{1,6}\s*)?_{0,2}(?:the\s+)?(?:final\s+)?answer(?:_{1,2})?\b[\s*_]*(?:is\b)?[\s*_]*[:=]?\s*", re.IGNORECASE)
_NUMBER = re.compile(r"-?(?:(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+)(?:/\d+)?")  # ".5" too
_THOUSANDS = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?")
_DECORATION = "*$`'\" \t"


def _last_tag(text: str) -> str | None:
    found = _ANSWER_TAG.findall(text)
    return found[-1].strip() if found else None


def _box_end(text: str, start: int, quotes: bool) -> int | None:
    """Index of the brace closing a box opened just before `start`; with `quotes`, braces inside a
    double-quoted string (a JSON answer: `\boxed{{"a": "}"}}`) are not counted."""
    depth, quoted, i = 1, False, start
    while i < len(text):
        c = text[i]
        if quoted:
            if c == "\\":
                i += 1
            elif c == '"':
                quoted = False
        elif c == '"' and quotes:
            quoted = True
        elif c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return None


MAX_BOXES = 16  # the last boxes tried: a repetition loop of unclosed `\boxed{` costs each one a scan to the end


def _last_boxed(text: str) -> str | None:
    starts = [m.end() for m in _BOXED.finditer(text)]
    for start in reversed(starts[-MAX_BOXES:]):
        # quote-aware first; a stray quote (5" for inches) leaves no closing brace, then count all braces
        end = _box_end(text, start, quotes=True)
        if end is None:
            end = _box_end(text, start, quotes=False)
        if end is not None:
            return text[start:end].strip()
    return None


def _strip_decoration(s: str) -> str:
    s = s.strip(_DECORATION)
    s = _PREFIX.sub("", s).strip(_DECORATION)
    return s[:-1].strip(_DECORATION) if s.endswith(".") else s


def _content_lines(text: str) -> list[str]:
    """The lines of `text` that can hold an answer: not empty, nor delimiters alone (the "\\]", "$$" or "```"
    closing a block)."""
    return [ln for ln in text.splitlines() if ln.strip(_DECORATION).rstrip(".") not in ("", "\\[", "\\]")]


def _answer_line(text: str) -> str:
    """The last non-empty line; when it is a sentence with no number and no "answer" prefix (a closing
    "I hope it is correct."), the last line before it that has one of them."""
    lines = _content_lines(text)
    if not lines:
        return ""
    last = lines[-1]
    if len(_strip_decoration(last).split()) <= 1:
        # a closing word ("Final answer: 12" then "Done"): the last line that names an answer with a number
        named = [ln for ln in lines[:-1] if _PREFIX.match(ln.strip(_DECORATION)) and _NUMBER.search(ln)]
        return named[-1] if named and not _NUMBER.search(last) else last
    for ln in reversed(lines):
        if _NUMBER.search(ln) or _PREFIX.match(ln.strip(_DECORATION)) or _named_later(ln):
            return ln
    return last


# "So the answer is Paris", "No wait, the answer is Paris": an answer named later in the line (not "I hope the
# answer is correct.")
_LATER = re.compile(r"\b(?:the|my|final)\s+answer\s+is\b[\s*_]*[:=]?\s*", re.IGNORECASE)
_CLOSERS = {"correct", "incorrect", "right", "wrong", "clear", "unclear", "helpful", "accurate", "complete", "valid",
            "satisfactory", "useful", "ok", "okay", "fine", "good", "above", "below", "as", "given", "shown",
            # a remark on an answer given earlier, mid-line ("12 + 5 = 17" and then "So the answer is consistent with
            # the check."; a line that starts "The answer is" is the answer line whatever follows)
            "reasonable", "consistent", "plausible", "likely", "unlikely", "verified", "confirmed", "checked",
            "sound", "obvious", "straightforward", "simple", "easy", "not", "still", "indeed", "probably",
            "final", "unchanged", "definitely", "certainly", "also", "always", "exactly", "just", "now",
            "based", "rounded", "same", "different"}
# words that start a remark more often than an answer ("the answer is the same", "... is in ...", "... is what ...")
_REMARK_STARTS = {"the", "that", "this", "what", "in", "on"}
_NAMED_WORDS = 8  # a tail longer than this is a sentence about the answer, not the answer


def _later_tail(line: str) -> str:
    """What follows the last "the/my/final answer is" in `line`, without decoration, a final period or "!?"; "" without
    one."""
    found = list(_LATER.finditer(line))
    return _strip_decoration(line[found[-1].end():].rstrip("!?")) if found else ""


def _named_later(line: str) -> str | None:
    """What follows the last "answer is" in `line` ("So the answer is Paris." gives "Paris"), without decoration or a
    final period; None without one, or when it is a closing remark ("I hope the answer is correct.")."""
    tail = _later_tail(line)
    words = tail.lower().split()
    if not words or len(words) > _NAMED_WORDS or words[0] in _REMARK_STARTS or _remark(words):
        return None
    return tail


def _remark(words: list[str]) -> bool:
    """Whether the words after "the answer is" remark on an answer ("correct", "rounded to ...") rather than name one."""
    return words[0] in _CLOSERS and (len(words) == 1 or words[0] != "right")


def _takes_back(line: str) -> bool:
    """Whether `line` names an answer again, of any length ("No wait, the answer is THE GOOD REMARKED MRS"), and not
    only remarks on one ("I hope the answer is correct.")."""
    words = _later_tail(line).lower().split()
    return bool(words) and not _remark(words)


def _line_answer(raw: str) -> str:
    """The answer in the answer line `raw` (see the module docstring)."""
    prefixed = _PREFIX.match(raw.strip(_DECORATION)) is not None
    line = _strip_decoration(raw)
    if not line.split() or len(line.split()) == 1:
        return line
    numbers = _NUMBER.findall(line)
    if not numbers:
        # "So the answer is Paris": what the line names, not the whole sentence
        return (None if prefixed else _named_later(line)) or line
    # a list of numbers and nothing else ("0.0, 0.5238", "4.89 4.56") is the answer, not its first or last number:
    # "The answer is 0.0, 0.5238" read as 0.0 gave full credit to a wrong extra root
    if len(numbers) > 1 and _number_list(line):
        return line
    # "The answer is 2, since 98 = 2 * 49": the number the prefix names, not the last one
    if prefixed:
        return numbers[0]
    # "So the answer is 2, since ...": the same, mid-line, where the number comes right after ("If the answer is
    # x, then 2x = 10, so x = 5" names no number there: the last one)
    named = _NAMED.search(line)
    if named and _number_list(line[named.start(1):]):  # "No wait, the answer is 0.0, 0.5238"
        return line[named.start(1):]
    return named.group(1) if named else numbers[-1]


_LIST_SEPARATOR = re.compile(r"\s*[,;]\s*|\s+(?:and\s+)?", re.IGNORECASE)


def _number_list(text: str) -> bool:
    """Whether `text` is two or more numbers and nothing else, apart from commas, semicolons, spaces and "and"
    between them. Read number by number: one pattern for the whole list backtracked exponentially on a long
    "1,000,000,...", whose commas are both thousands separators and list separators."""
    found = list(_NUMBER.finditer(text))
    if len(found) < 2 or found[0].start() != 0 or found[-1].end() != len(text):
        return False
    return all(_LIST_SEPARATOR.fullmatch(text[a.end():b.start()]) for a, b in zip(found, found[1:]))


_NAMED = re.compile(r"\banswer\s+is\s*[:=]?[\s$*]*(" + _NUMBER.pattern + ")", re.IGNORECASE)


def answer_candidates(completion: str) -> list[str]:
    """What a completion may be answering with: `extract_answer` first and, without a tag or box, the
    whole answer line as well (a gold answer with words, "12 apples" or "2, 3", is compared with both)."""
    marked = _last_tag(completion)
    if marked is None:
        marked = _last_boxed(completion)
    if marked is not None:
        return [_lone_number(_unwrap(marked))]
    raw = _answer_line(completion)
    first, line = _lone_number(_line_answer(raw)), _strip_decoration(raw)
    return [first, line] if line and line != first else [first]


_TEXT_WRAPPER = re.compile(r"\\(?:text|textbf|textit|textrm|mathrm|mathbf|mbox)\s*\{([^{}]*)\}")


def _unwrap(marked: str) -> str:
    """A tag's or box's contents without a box that is the whole of the tag's ("<answer>\\boxed{12}</answer>",
    also between $...$) or a text wrapper that is the whole answer ("\\boxed{\\text{Yes}}")."""
    inner = marked.strip(_DECORATION)
    opened = _BOXED.match(inner)
    if opened:
        end = _box_end(inner, opened.end(), quotes=True)
        if end is None:
            end = _box_end(inner, opened.end(), quotes=False)
        if end == len(inner) - 1:
            marked = inner[opened.end():end].strip()
    m = _TEXT_WRAPPER.fullmatch(marked.strip())
    return m.group(1).strip() if m else marked


def _lone_number(answer: str) -> str:
    answer = answer.strip()
    return answer.replace(",", "") if _THOUSANDS.fullmatch(answer) else answer


def extract_answer(completion: str) -> str:
    """The final answer in a completion, by the rule in the module docstring ('' if none)."""
    return answer_candidates(completion)[0]


LINE_READERS = ("exact_match", "reasoning_gym")


def multiline_answers_note(items: list[PromptItem], instruction: str, reward: str) -> str | None:
    """A warning when gold answers span several lines but nothing asks for a tag or a box (`instruction`:
    the instruction and system prompt, what the prompt asks of the model): the
    built-in verifiers (`LINE_READERS`) then read only the last line of a completion, so a correct
    multi-line answer (a grid, a board) scores as its last line."""
    if reward not in LINE_READERS or "<answer>" in instruction or "\\boxed" in instruction:
        return None
    tasks = sorted({it.task for it in items if "\n" in gold_answer(it).strip()})
    if not tasks:
        return None
    return (f"the gold answers of {', '.join(tasks)} span several lines, and the {reward} verifier reads only a "
            "completion's last line unless the answer is in <answer>...</answer> or \\boxed{...}; ask for the tags "
            "in data.instruction (for example data.instruction=\"Give the final answer in <answer></answer> tags.\")")


LENIENT_CHECK_S = 30.0  # seconds `lenient_scorer_note` may score for: it runs in the trainer, at the run's start


class _OutOfTime(BaseException):
    """`_time_limit`'s alarm (a BaseException: a scorer's own `except Exception` passes it on)."""


@contextlib.contextmanager
def _time_limit(seconds: float | None) -> Any:
    """Raise _OutOfTime in the code this runs once `seconds` have passed (SIGALRM from the real-time timer), and
    yield a function that says whether they have (for code that swallowed the exception). Only on the main thread of
    a POSIX process whose real-time timer is unarmed and whose SIGALRM handler Python can restore; elsewhere there is
    no bound. A call stuck in C code that never returns to Python is not interrupted."""
    import signal
    import threading

    state = {"over": False}
    usable = (seconds is not None and seconds > 0 and hasattr(signal, "setitimer")
              and threading.current_thread() is threading.main_thread()
              and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0))
    before = signal.getsignal(signal.SIGALRM) if usable else None
    if before is None:  # not usable, or a handler not set from Python (not restorable)
        yield lambda: False
        return

    def alarm(signum: int, frame: Any) -> None:
        state["over"] = True
        raise _OutOfTime

    signal.signal(signal.SIGALRM, alarm)
    try:
        signal.setitimer(signal.ITIMER_REAL, seconds)
        yield lambda: state["over"]
    finally:
        while True:  # an alarm that lands in here raises once more: the timer and the handler are put back anyway
            try:
                signal.setitimer(signal.ITIMER_REAL, 0)
                signal.signal(signal.SIGALRM, before)
                break
            except _OutOfTime:
                continue


def lenient_scorer_note(items: list[PromptItem], reward: str, per_task: int = 8,
                        budget: float | None = LENIENT_CHECK_S) -> str | None:
    """A warning naming the reasoning-gym tasks whose own scorer gives a wrong answer full credit (under
    `reward` reasoning_gym, which uses it): of up to `per_task` items of a task, each is scored with the gold
    answer of another of them whose gold differs, and a task where every such wrong answer scores 1 is named
    (reasoning-gym 0.1.25's game_of_life_halting compares bool(answer) with bool(gold), so any answer scores 1
    and its groups teach nothing; puzzle24's checks that an expression makes 24, not that it uses the question's
    numbers).

    The scorers run in this process (the trainer's), so their time is bounded by `budget` seconds in all (None: no
    bound; see `_time_limit` for where a bound applies): a scorer that hangs must not hang the run's start. The
    check then stops, and the warning says so and which tasks it left unchecked."""
    if reward != "reasoning_gym":
        return None
    by_task: dict[str, list[PromptItem]] = {}
    for it in items:
        if (it.entry.get("metadata") or {}).get("source_dataset") and len(by_task.get(it.task, ())) < per_task:
            by_task.setdefault(it.task, []).append(it)
    named = []
    tasks, checking = list(by_task), 0  # the index of the task being checked
    stopped = None
    try:
        with _time_limit(budget) as over:
            for i, task in enumerate(tasks):
                checking, its = i, by_task[task]
                tried = []  # one wrong answer for each item that has one: the last other item's gold that differs
                for a in its:
                    b = next((b for b in reversed(its) if gold_answer(b) != gold_answer(a)), None)
                    if b is not None:
                        tried.append((a, b))
                if len(tried) < 2:
                    continue
                try:
                    full = True  # all(...), with a look at the clock between calls
                    for a, b in tried:
                        if over():
                            raise _OutOfTime
                        if reasoning_gym(gold_answer(b), a) != 1.0:
                            full = False
                            break
                except Exception:  # noqa: BLE001 - a scorer that fails here is reported per sample when the reward runs
                    continue
                if full:
                    a, b = tried[0]
                    named.append(f"{task} (gold {gold_answer(a)!r}, answer {gold_answer(b)!r}: 1.0)")
            checking = len(tasks)
    except _OutOfTime:
        if checking < len(tasks):  # (an alarm just after the last task changes nothing)
            left = len(tasks) - checking - 1
            later = f" and {left} later task{'s' if left > 1 else ''}" if left else ""
            stopped = f"the check stopped after {budget:g} s, at task {tasks[checking]}: it{later} went unchecked"
    if not named:
        if stopped is None:
            return None
        return (f"checking whether the reasoning-gym scorers give other items' gold answers full credit took too "
                f"long: {stopped}")
    note = (f"the reasoning-gym scorer of {', '.join(named)} gives full credit to the gold answers of other items "
            "of the task, so it rewards answers that do not solve the question (where any answer scores 1, groups "
            "have equal rewards and teach nothing): leave the task out of data.tasks, or score it with "
            "reward.functions=[{name: exact_match}]")
    return note if stopped is None else f"{note} ({stopped})"


def gold_answer(item: PromptItem) -> str:
    """The item's gold answer; GSM8K-style '#### 72' keeps what follows the last '####'."""
    answer = str(item.answer)
    if "####" in answer:
        answer = answer.rsplit("####", 1)[1]
    return answer.strip()


_FRAC = re.compile(r"\\[dt]?frac\{([^{}]+)\}\{([^{}]+)\}")
_ASSIGN = re.compile(r"^[a-z]\s*=\s*")


def normalize(answer: str) -> str:
    """Lower case, single spaces, no decoration, final period or trailing punctuation, no thousands
    separators; a LaTeX fraction becomes a/b, a Unicode minus '-', '12%' '12', 'x = 12' '12', '(12)'
    '12', '\\$18' '18', '\\(12\\)' '12', and '2, 3' '2,3'."""
    s = " ".join(answer.split()).lower().replace("\u2212", "-").replace("\\$", "$")
    s = _FRAC.sub(r"\1/\2", s)
    s = s.strip(_DECORATION)
    s = s.rstrip(".,;:!?").strip(_DECORATION)
    for left, right in (("\\(", "\\)"), ("\\[", "\\]")):  # inline math, as $...$ is
        if s.startswith(left) and s.endswith(right) and s.count(left) == 1:
            s = s[2:-2].strip(_DECORATION)
    s = _ASSIGN.sub("", s)
    if s.endswith("\\%"):
        s = s[:-2]
    s = s.removesuffix("%").strip()
    if len(s) > 1 and s[0] == "(" and s[-1] == ")" and s.count("(") == 1:
        s = s[1:-1].strip()
    if _THOUSANDS.fullmatch(s):
        s = s.replace(",", "")
    return s.replace(", ", ",")


_PLAIN_NUMBER = re.compile(r"-?(?:\d+(?:\.\d*)?|\.\d+)(?:/\d+)?")


def _as_fraction(s: str) -> Fraction | None:
    """The value of a plain number: an integer, a decimal, or a fraction in lowest terms ("84/2" is the question's
    expression, not the answer 42). Exponents are not read ("1e10000000" would build that number)."""
    if not _PLAIN_NUMBER.fullmatch(s):
        return None
    try:
        value = Fraction(s)
    except (ValueError, ZeroDivisionError):
        return None
    if "/" in s:  # as written, numerator and denominator must be the reduced ones, the denominator above 1
        num, den = s.lstrip("-").split("/")
        if "." in num or (int(num), int(den)) != (abs(value.numerator), value.denominator) or value.denominator == 1:
            return None
    return value


def answers_match(predicted: str, gold: str) -> bool:
    """Normalised string equality; numbers compare by value ('4.0' == '4', '1/2' == '0.5')."""
    p, g = normalize(predicted), normalize(gold)
    if not p:
        return False
    if p == g:
        return True
    pf, gf = _as_fraction(p), _as_fraction(g)
    return pf is not None and gf is not None and pf == gf


# ------------------------------------------------------------------ reward functions


def exact_match(completion: str, item: PromptItem) -> float:
    """1.0 if an answer candidate equals the gold answer after `normalize` (numbers by value)."""
    gold = gold_answer(item)
    return 1.0 if any(answers_match(c, gold) for c in answer_candidates(completion)) else 0.0


@cache
def _rg_scorer(source_dataset: str) -> Callable[[str, dict], float]:
    import reasoning_gym

    return reasoning_gym.get_score_answer_fn(source_dataset)


def reasoning_gym(completion: str, item: PromptItem) -> float:
    """The generator's own `score_answer` on the extracted answer, or on the whole answer line (without a tag
    or box, and without words) where that line, and not the extracted answer, gets full credit, or on the gold
    answer where the last line or the answer line (without a tag or box) is the gold answer word for word
    ("-36.0 + 15.0i", "1 days, 14:27:36", a sentence), with or without an "answer is" prefix.

    Items without ``entry['metadata']['source_dataset']`` (file tasks) fall back to
    `exact_match`. Note that reasoning-gym's default scorer gives partial credit
    len(gold)/len(answer) when the gold answer is a substring of the extracted answer.
    """
    source = (item.entry.get("metadata") or {}).get("source_dataset")
    matched = exact_match(completion, item)
    # "3." or "$3$" for 3: the generators' scorers compare exact strings and gave those partial credit; a gold
    # answer with letters is left to its scorer (exact_match ignores case: caesar_cipher's scorer does not)
    if not source or (matched and not any(ch.isalpha() for ch in gold_answer(item))):
        return matched
    entry = item.entry if "answer" in item.entry else {**item.entry, "answer": item.answer}
    scorer = _rg_scorer(source)
    first, *line = answer_candidates(completion)
    score = float(scorer(first, entry))
    # an expression with spaces is the whole answer line, not its last number: countdown's and puzzle24's
    # ("4*94 - 6 - 61"). Only a line without words, and only where its scorer gives it full credit: some scorers
    # read the first number of free text (gsm_symbolic gave "288 boxes ..., so the answer is 1152." full credit
    # for 288), and "The answer is 5 + 7 = 12." still reads 5
    if score < 1.0 and line and not any(ch.isalpha() for ch in line[0]):
        with contextlib.suppress(Exception):  # the line is a second chance: its failure keeps the first score
            if float(scorer(line[0], entry)) == 1.0:
                return 1.0
    # the gold answer written out as the last line or the answer line, word for word: "-36.0 + 15.0i",
    # '{"sequence": [51]}', "1 days, 14:27:36", "There's the rub." (its period kept) scored as their last number or
    # a sentence's partial credit, and a last line "THE GOOD REMARKED MRS" after reasoning with numbers as that
    # reasoning line. Only the gold answer itself, and only where its scorer gives it full credit
    if score < 1.0:
        said = _said_as_written(completion, str(entry["answer"]))
        if said is not None:
            with contextlib.suppress(Exception):
                if float(scorer(said, entry)) == 1.0:
                    return 1.0
    return score


def _said_as_written(completion: str, gold: str) -> str | None:
    """Without a tag or box: the last line (delimiter lines such as "$$" aside) or the answer line (`_answer_line`:
    the one before a closing "I hope it is correct.") when it is `gold` word for word (whitespace runs aside), with
    or without an "answer is" before it, surrounding decoration and a final period; else None. Not any earlier line,
    nor the answer line when a line after it names an answer again: it may be an answer taken back ("The answer is
    X" and then "No wait, the answer is Y")."""
    if _last_tag(completion) is not None or _last_boxed(completion) is not None:
        return None
    target = " ".join(gold.split())
    lines = [ln.strip() for ln in _content_lines(completion)]
    if not target or not lines:
        return None
    candidates = [lines[-1]]
    answer_line = _answer_line(completion).strip()
    after = lines[lines.index(answer_line) + 1:] if answer_line in lines else []
    if not any(_takes_back(ln) for ln in after):  # no later line names an answer again (a take-back, however long)
        candidates.append(answer_line)
    for raw in dict.fromkeys(candidates):
        bare = _PREFIX.sub("", raw.strip(_DECORATION)).strip()
        later = _LATER.split(raw)[-1].strip() if _LATER.search(raw) else ""  # "So the answer is -36.0 + 15.0i."
        for cand in (raw, bare, bare.removesuffix(".").rstrip(), _strip_decoration(raw), later,
                     later.removesuffix(".").rstrip()):
            if " ".join(cand.split()) == target:
                return cand
    return None


def prepare_reasoning_gym(items: list[PromptItem]) -> None:
    """Build (and cache) the scorers the items need, so the first call is not slow."""
    for item in items:
        source = (item.entry.get("metadata") or {}).get("source_dataset")
        if source:
            with contextlib.suppress(Exception):  # reported per sample when the reward runs
                _rg_scorer(source)


def math_verify(completion: str, item: PromptItem) -> float:
    """math-verify equivalence of the gold answer and the completion (its <answer> tag if any).

    math-verify's own signal-based timeouts are off (they fail outside the main thread);
    `RewardRunner` enforces the timeout instead.
    """
    from math_verify import parse, verify

    for name in ("math_verify.parser", "math_verify.grader"):  # the "timeout disabled" notice
        logging.getLogger(name).setLevel(logging.ERROR)
    # a Unicode minus and LaTeX's dollar sign "\\$18", which math-verify does not read (it parsed to nothing)
    completion = completion.replace("\u2212", "-").replace("\\$", "")
    completion = _BOLD.sub(r"\1", completion)  # "**3/4**" parsed as 3, "<answer>**12**</answer>" as nothing
    tagged = _last_tag(completion)
    gold = _math_parse(gold_answer(item))
    pred = _math_parse(tagged) if tagged is not None else parse(completion, parsing_timeout=None)
    if not gold or not pred:
        return 0.0
    return 1.0 if verify(gold, pred, timeout_seconds=None) else 0.0


# markdown bold, "**3/4**" (not Python's power, "x**2": the opening "**" follows no word character)
_BOLD = re.compile(r"(?<![\w*])\*\*(?=\S)(.+?)(?<=\S)\*\*(?![\w*])")


def _math_parse(text: str) -> list:
    """math-verify's parse of an answer on its own (a gold answer, an <answer> tag's contents). Bare LaTeX
    such as \\frac{\\sqrt{3}}{2} or 2\\sqrt{2} is read as math only between $...$ (parsed raw, it
    gave [] or just its last number), so it is wrapped first; plain text falls back to the raw parse."""
    from math_verify import parse

    if not any(d in text for d in ("$", "\\boxed", "\\(", "\\[")):
        wrapped = parse(f"${text}$", parsing_timeout=None)
        if wrapped:
            return wrapped
    return parse(text, parsing_timeout=None)


def format_reward(completion: str, item: PromptItem) -> float:
    """1.0 if the answer is in the expected format, else 0.0.

    Expected format: if the completion has ``<answer>...</answer>`` (else ``\\boxed{...}``),
    the last one must be non-empty; without either, the stripped completion must be a bare
    final answer: one non-empty line of at most `FORMAT_MAX_CHARS` (32) characters.
    """
    del item
    marked = _last_tag(completion)
    if marked is None:
        marked = _last_boxed(completion)
    if marked is not None:
        return 1.0 if marked else 0.0
    text = completion.strip()
    return 1.0 if text and "\n" not in text and len(text) <= FORMAT_MAX_CHARS else 0.0


VERIFIERS: dict[str, RewardFn] = {
    "reasoning_gym": reasoning_gym,
    "math_verify": math_verify,
    "exact_match": exact_match,
    "format": format_reward,
}


def load_user_function(spec: str) -> RewardFn:
    """Import 'package.module:function'; raises ConfigError naming what failed."""
    module_name, sep, attr = spec.rpartition(":")  # rpartition: a Windows path has a drive colon
    if not sep or not module_name or not attr:
        raise ConfigError(f"reward function '{spec}' must be written 'module:function' or 'path/to/file.py:function'")
    if os.getcwd() not in sys.path and "" not in sys.path:  # the `rollwise` script, unlike `python -m`, lacks it
        sys.path.append(os.getcwd())  # last: a file here never shadows an installed package
    try:
        module = _import_file(module_name) if module_name.endswith(".py") else importlib.import_module(module_name)
    except FileNotFoundError as e:
        raise ConfigError(f"reward function '{spec}': file '{module_name}' not found (looked for it from "
                          f"{os.getcwd()})") from e
    except (Exception, SystemExit) as e:  # sys.exit() at import would end rollwise without a word
        raise ConfigError(
            f"reward function '{spec}': cannot import module '{module_name}' "
            f"({type(e).__name__}: {e}); is it on PYTHONPATH (the current folder is), or give its file: "
            "'path/to/file.py:function'?"
        ) from e
    fn = module
    for part in attr.split("."):
        if not hasattr(fn, part):
            raise ConfigError(f"reward function '{spec}': module '{module_name}' has no attribute '{attr}'")
        fn = getattr(fn, part)
    if not callable(fn):
        raise ConfigError(f"reward function '{spec}': '{attr}' in '{module_name}' is not callable")
    check_signature(spec, fn)
    return fn  # type: ignore[return-value]


def _import_file(path: str) -> Any:
    """The module in the Python file `path` (a reward function given as 'path/to/file.py:function')."""
    file = Path(path).expanduser().resolve()
    if not file.is_file():
        raise FileNotFoundError(path)
    name = f"rollwise_user_{file.stem}_{abs(hash(str(file))) % 10**8}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, file)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)  # type: ignore[union-attr]
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def check_signature(spec: str, fn: Callable[..., Any]) -> None:
    """ConfigError unless `fn` can be called as fn(completion, item), the way the worker calls it
    (a TRL-style fn(completions, **kwargs), called once per batch, cannot)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # some builtins and C functions have none: left to the call
        return
    try:
        sig.bind("completion", object())
    except TypeError as e:
        raise ConfigError(
            f"reward function '{spec}' has the signature {sig}, which cannot be called as f(completion, item) "
            f"({e}). rollwise calls it once per sample with the completion text and the prompt's item (.question, "
            ".answer, .task, .entry) and expects a number back; a TRL-style f(completions, **kwargs) needs a "
            "small wrapper") from e


def resolve(name: str) -> RewardFn:
    """A built-in verifier by name, or a user function 'module:function'."""
    if name in VERIFIERS:
        return VERIFIERS[name]
    if ":" in name:
        return load_user_function(name)
    raise ConfigError(f"unknown reward '{name}'; allowed: {', '.join(sorted(VERIFIERS))}, 'module:function' or "
                      "'path/to/file.py:function'")
