"""Build the training and evaluation items of a task mixture.

`train_size` and `eval_size` are split among the tasks in proportion to their weights
(largest remainder; ties go to the earlier task).

Held-out items are drawn first (an unbiased sample of each task), then training items that avoid
their questions: a training item whose question text is held out is skipped and the next one
drawn (file rows: dropped), so the two never overlap.

reasoning-gym tasks: eval items come from `create_dataset(name, size, seed=s_eval)`, train items
from another, far-away seed (reasoning-gym seeds items with seed + index, so nearby seeds share
items). A generator whose question space is too small to supply enough distinct questions gives
fewer items, with a warning.

File tasks (`path` set): JSON and CSV cells are read as the text written in the file (a gold answer
"007", "1.50" or 9007199254740993 stays as written, never rounded through a float); Parquet through
pyarrow, its typed cells turned into text. A file with no rows is an error; messages name a row by
its place in the file ("line 3"). Rows with a missing or empty question or answer are skipped
(counted in a warning). Valid rows are shuffled by seed; the
last ones go to eval (this task's share of `eval_size`, at most 20% of the rows), the first
ones to training (its share of `train_size`, at most what is left: rows are never repeated).
Training rows whose question is held out are dropped (the next rows taken instead; said in a warning; a
file task left with no training row is an error). A compressed file (.gz, ...) is refused, with how to unpack it. A prompt cell may be a conversation (a
list of {role, content} messages): its last user message is the question. `entry` is {"question", "answer"}, so
the reasoning_gym reward scores file items with `exact_match`.

reasoning-gym's basic_arithmetic gives some items a gold answer that is not the value of the
expression in their question (0.1.25: with allow_parentheses=false it ignores operator precedence,
"985 + 384 * 129" -> 176601, and divisions come out rounded or rewritten). Each basic_arithmetic
item's expression is evaluated exactly (`arithmetic_truth`); items whose gold answer differs are
left out, counted in a warning.

uids: "<task>:<split>:<index>" (reasoning-gym index, or the row's number in the file from 0, blank lines
and a CSV header not counted); a task name
used twice gets "#2", "#3" in the uid (the next free one where another task is named so). A task whose share of
`train_size` rounds to 0 is said in a warning. Parquet text stored as bytes (binary columns) is read as UTF-8; a lone surrogate escape in
JSON ("\\ud83d", half a character) is read as U+FFFD, with a warning. Train items are shuffled by seed; eval keeps task order.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import hashlib
import json
import logging
import math
import operator
import random
import re
import warnings
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path
from typing import Any

from rollwise.config import ConfigError, DataConfig, TaskSpec
from rollwise.types import PromptItem

log = logging.getLogger(__name__)

MAX_FILE_EVAL_SHARE = 0.2
_FORMATS = (".jsonl", ".json", ".parquet", ".csv")  # JSON and CSV read as text, Parquet through pyarrow
_FORMAT_HINT = {".jsonl": "one JSON object per line", ".json": "a JSON list of objects, or one object per line",
                ".csv": "a header row, then one row per item; quote cells that hold commas",
                ".parquet": "a Parquet table"}
_COMPRESSED = {".gz": "gunzip -c", ".gzip": "gunzip -c", ".bz2": "bunzip2 -c", ".xz": "unxz -c", ".zst": "zstd -dc",
               ".zip": "unzip -p", ".tgz": "tar -xOzf", ".tar": "tar -xOf"}  # not read; each: how to unpack it to stdout
_MAGIC = {rb"\x1f\x8b": ".gz", rb"BZh[1-9]1AY&SY": ".bz2", rb"\xfd7zXZ\x00": ".xz", rb"\x28\xb5\x2f\xfd": ".zst",
          rb"PK\x03\x04": ".zip"}  # a compressed file's first bytes
_SURROGATE = re.compile("[\ud800-\udfff]")  # JSON's "\\ud83d" alone: read by json, refused by every encoder
_LIST_HINT = "python -c \"import reasoning_gym.factory as f; print(sorted(f.DATASETS))\""


def allocate(total: int, weights: list[float]) -> list[int]:
    """Split `total` in proportion to `weights`: largest remainder, ties to the earlier index."""
    # as written (0.3 and 0.1 are 3:1 exactly), so float rounding never decides a tie
    ws = [Fraction(repr(float(w))) for w in weights]
    exact = [total * w / sum(ws) for w in ws]
    counts = [math.floor(x) for x in exact]
    order = sorted(range(len(weights)), key=lambda i: (-(exact[i] - counts[i]), i))
    for i in order[: total - sum(counts)]:
        counts[i] += 1
    return counts


def _seed(seed: int, *parts: object) -> int:
    digest = hashlib.sha256(":".join(str(p) for p in (seed, *parts)).encode()).digest()
    return int.from_bytes(digest[:4], "big") % (2**31 - 2**24)


def _labels(tasks: list[TaskSpec]) -> list[str]:
    labels: list[str] = []
    for t in tasks:
        k = sum(1 for other in tasks[: len(labels)] if other.name == t.name)
        label = t.name if k == 0 else f"{t.name}#{k + 1}"
        while label in labels:  # a task named "a#2" beside two named "a": its own label, so uids never collide
            k += 1
            label = f"{t.name}#{k + 1}"
        labels.append(label)
    return labels


# ------------------------------------------------------------------ reasoning-gym


def _rg_dataset(task: TaskSpec, size: int, seed: int) -> Any:
    import reasoning_gym
    from reasoning_gym.factory import DATASETS

    if task.name not in DATASETS:
        close = difflib.get_close_matches(task.name, list(DATASETS), n=4, cutoff=0.5)
        hint = f" Close names: {', '.join(close)}." if close else ""
        raise ConfigError(f"data.tasks: unknown reasoning-gym generator '{task.name}'.{hint} List all with: {_LIST_HINT}")
    clash = {"size", "seed"} & set(task.params)
    if clash:
        raise ConfigError(f"data.tasks['{task.name}'].params: {', '.join(sorted(clash))} is set by rollwise; remove it")
    config_cls = DATASETS[task.name][1]
    if dataclasses.is_dataclass(config_cls):
        known = {f.name for f in dataclasses.fields(config_cls)} - {"size", "seed"}
        bad = sorted(set(task.params) - known)
        if bad:
            raise ConfigError(
                f"data.tasks['{task.name}'].params: unknown parameter(s) {', '.join(bad)}; "
                f"allowed: {', '.join(sorted(known))}"
            )
    try:
        return reasoning_gym.create_dataset(task.name, size=size, seed=seed, **task.params)
    except (TypeError, ValueError, AssertionError) as e:
        raise ConfigError(f"data.tasks['{task.name}'].params {task.params}: {type(e).__name__}: {e}") from None


_CALCULATE = re.compile(r"^Calculate ([\d\s+\-*/().]+?)\.?$")
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def _exact(node: ast.AST) -> Fraction:
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return Fraction(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = _exact(node.operand)
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_exact(node.left), _exact(node.right))
    raise ValueError(f"not plain arithmetic: {ast.dump(node)[:80]}")


def _expression(item: PromptItem) -> str | None:
    """A basic_arithmetic item's expression: reasoning-gym's metadata names it (any question wording,
    "Calculate ...", "What is ...?", "Solve ..."), else "Calculate EXPR." is read from the question."""
    if item.task != "basic_arithmetic":
        return None
    expr = ((item.entry or {}).get("metadata") or {}).get("expression")
    if isinstance(expr, str) and expr.strip() and expr.strip() in item.question:
        return expr.strip()
    m = _CALCULATE.match(item.question.strip())
    return m.group(1) if m else None


def _value(item: PromptItem) -> Fraction | None:
    """The exact value of the item's expression; None when it has none that can be read. Raises
    ZeroDivisionError for an expression that divides by zero."""
    expr = _expression(item)
    if expr is None or not re.fullmatch(r"[\d\s+\-*/().]+", expr):
        return None
    try:
        return _exact(ast.parse(expr, mode="eval").body)
    except (SyntaxError, ValueError, RecursionError):
        return None


def arithmetic_truth(item: PromptItem) -> Fraction | None:
    """The exact value of a basic_arithmetic item's expression ("985 + 384 * 129"), with the usual
    operator precedence; None for other tasks, an expression it cannot find, and division by zero."""
    try:
        return _value(item)
    except ZeroDivisionError:
        return None


def wrong_gold(item: PromptItem) -> bool:
    """The item's gold answer is not the value of its expression (`arithmetic_truth`); an expression
    that divides by zero has no value, so any gold answer is wrong. Items whose expression cannot be
    read are kept."""
    try:
        truth = _value(item)
    except ZeroDivisionError:
        return True
    if truth is None:
        return False
    try:
        return Fraction(item.answer.strip()) != truth
    except (ValueError, ZeroDivisionError):
        return True


def repeated_questions_note(items: list[PromptItem], share: float = 0.8) -> str | None:
    """A note naming the tasks whose training items repeat questions (fewer than `share` distinct):
    reasoning-gym draws independently from a question space that can be small (the default lcm's 800
    items hold about 260 questions). Each repeat is its own prompt to the planner, with its own belief."""
    by_task: dict[str, list[str]] = {}
    for it in items:
        by_task.setdefault(it.task, []).append(it.question)
    low = [(t, len(set(q)), len(q)) for t, q in by_task.items() if len(set(q)) < share * len(q)]
    if not low:
        return None
    told = ", ".join(f"{t} {d} of {n}" for t, d, n in low)
    return (f"training items that repeat a question (distinct questions: {told}); each repeat is a prompt of its own "
            "to the planner, with its own belief. A small question space does this; widen the task's parameters for "
            "more distinct questions")


def _rg_item(task: TaskSpec, label: str, split: str, index: int, entry: dict[str, Any]) -> PromptItem:
    return PromptItem(
        uid=f"{label}:{split}:{index}", task=task.name, question=str(entry["question"]),
        answer=str(entry["answer"]), entry=entry,
    )


def _rg_draw(task: TaskSpec, label: str, split: str, n: int, seed: int, budget: int,
             keep: Callable[[PromptItem], bool]) -> tuple[list[PromptItem], int]:
    """Up to n items of the generator's stream for `split` that `keep` accepts, trying `budget`
    candidates; candidates with a wrong gold answer (`wrong_gold`) are left out and do not count
    against the budget (the stream is read further, up to 20 times the budget). Returns the items and
    how many were left out for a wrong gold answer."""
    s = _seed(seed, label, split)
    size = max(budget, 1)
    ds = _rg_dataset(task, size, s)  # validates the parameters even when n == 0
    out: list[PromptItem] = []
    wrong = i = 0
    while len(out) < n and i < min(budget + wrong, 20 * size):
        if i == len(ds):  # the stream goes on past the first dataset: the same items, more of them
            ds = _rg_dataset(task, min(2 * len(ds), 20 * size), s)
        try:  # a parameter of the wrong type can pass the config's checks and fail only here
            entry = ds[i]
        except (TypeError, ValueError, AssertionError) as e:
            raise ConfigError(f"data.tasks['{task.name}'].params {task.params}: {type(e).__name__}: {e} (generating "
                              "an item); check each parameter's type and range") from None
        item = _rg_item(task, label, split, i, entry)
        i += 1
        if wrong_gold(item):
            wrong += 1
        elif keep(item):
            out.append(item)
    if wrong:
        log.warning("task '%s': %d of %d %s items left out: their gold answer is not the value of their expression "
                    "(reasoning-gym's basic_arithmetic ignores operator precedence with allow_parentheses=false and "
                    "rounds divisions; operators [\"+\", \"-\", \"*\"] with allow_parentheses=true, or 2 terms without "
                    "division, avoid both)", label, wrong, i, "training" if split == "train" else "held-out")
    return out, wrong


def _rg_train(task: TaskSpec, label: str, n: int, seed: int, exclude: set[str]) -> list[PromptItem]:
    """n training items whose questions are not in `exclude` (the held-out questions)."""
    out, wrong = _rg_draw(task, label, "train", n, seed, 2 * n + 200, lambda it: it.question not in exclude)
    if len(out) < n:
        why = f"; {wrong} more had a wrong gold answer" if wrong else ""
        log.warning("task '%s': only %d of %d training items avoid the held-out questions%s", label, len(out), n, why)
    return out


def _rg_eval(task: TaskSpec, label: str, n: int, seed: int, seen: set[str]) -> list[PromptItem]:
    """n held-out items with distinct questions, drawn first so that they are an unbiased
    sample of the task (training then avoids them, not the other way round: excluding the
    training questions would leave only the rare, usually harder ones for evaluation)."""
    if n == 0:
        return []

    def new(it: PromptItem) -> bool:
        if it.question in seen:
            return False
        seen.add(it.question)
        return True

    # 20n + 200 candidates tried before giving up on a small question space
    out, wrong = _rg_draw(task, label, "eval", n, seed, 20 * n + 200, new)
    if len(out) < n:
        why = f"; {wrong} more had a wrong gold answer" if wrong else ""
        log.warning("task '%s': only %d of %d eval items have distinct questions (small question space)%s",
                    label, len(out), n, why)
    return out


# ------------------------------------------------------------------ files


def _cell(value: Any) -> str | None:
    """A cell as text, None when missing or blank. JSON and CSV cells arrive as the text written in the file;
    a Parquet float that holds a whole number is written without its ".0", a boolean as "true" or "false"."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    if isinstance(value, bool):  # JSON's true as written, not Python's "True" (a Parquet boolean likewise)
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    text = str(value).strip()
    return text or None


_Records = list[tuple[str, dict[str, Any]]]  # (where the row is in the file, its cells), in file order


def _unreadable(task: TaskSpec, path: Path, why: str) -> ConfigError:
    return ConfigError(f"data.tasks['{task.name}']: could not read '{path}' as {path.suffix} ({why[:300]}); fix the "
                       f"file ({_FORMAT_HINT[path.suffix.lower()]}) or convert it")


def _no_rows(task: TaskSpec, path: Path, what: str) -> ConfigError:
    return ConfigError(f"data.tasks['{task.name}']: '{path}' holds no rows ({what}); add one row per item "
                       f"({_FORMAT_HINT[path.suffix.lower()]}), or point data.tasks[...].path at the file that has them")


def _json(task: TaskSpec, path: Path, text: str, line: int | None) -> Any:
    """One JSON value; numbers stay the text written in the file ("1.50", "9007199254740993"), so a gold
    answer is never rounded through a float. `line`: the file line `text` is, None for the whole file."""
    try:
        return json.loads(text, parse_int=str, parse_float=str)
    except json.JSONDecodeError as e:
        at = f"line {line}, column {e.colno}" if line else f"line {e.lineno}, column {e.colno}"
        raise _unreadable(task, path, f"not valid JSON at {at}: {e.msg}") from None
    except RecursionError:
        raise _unreadable(task, path, f"JSON nested too deeply{f' on line {line}' if line else ''}") from None


def _json_columns(doc: dict[str, Any]) -> _Records | None:
    """The rows of a JSON object of columns ({"prompt": [...], "answer": [...]}, or pandas' to_json, whose
    columns map row numbers to cells); None when `doc` is not one."""
    cols = list(doc.values())
    numbered = all(isinstance(c, list) or (isinstance(c, dict) and all(k.isdigit() for k in c)) for c in cols)
    if not cols or not numbered or len({len(c) for c in cols}) != 1:
        return None
    numbers = [list(c) for c in cols if isinstance(c, dict)]  # a row's cells share its number, in any order
    if numbers and any(set(n) != set(numbers[0]) for n in numbers):
        return None
    cells = {k: [c[j] for j in numbers[0]] if isinstance(c, dict) else c for k, c in doc.items()}
    return [(f"row {i + 1}", {k: c[i] for k, c in cells.items()}) for i in range(len(cols[0]))]


def _one_object(text: str) -> bool:
    """Whether the whole file is one JSON object (written over one line or many)."""
    try:
        return isinstance(json.loads(text), dict)
    except (json.JSONDecodeError, RecursionError):
        return False


def _json_records(task: TaskSpec, path: Path) -> _Records:
    """The objects of a JSON file: a list of objects, an object of columns, or one object per line (blank
    lines skipped)."""
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as e:
        raise _unreadable(task, path, f"not UTF-8 text: {e}") from None
    whole = text.lstrip().startswith("[") or _one_object(text)
    if whole:
        doc = _json(task, path, text, None)
        records = ([(f"item {i + 1} of the list", v) for i, v in enumerate(doc)] if isinstance(doc, list) else
                   _json_columns(doc) or [("its one object", doc)])
    else:
        # only \n, \r\n and \r end a line: splitlines() also split inside strings at U+2028, U+2029 and U+0085,
        # which JSON allows unescaped (json.dumps(ensure_ascii=False) writes them so)
        records = [(f"line {n}", _json(task, path, s, n)) for n, s in enumerate(re.split(r"\r\n?|\n", text), 1) if s.strip()]
    for place, value in records:
        if not isinstance(value, dict):
            raise _unreadable(task, path, f"{place} is {str(value)[:40]!r}, not a JSON object with a key per column")
    return records


def _csv_records(task: TaskSpec, path: Path) -> _Records:
    """The rows of a CSV file, every cell read as the text written ("007", "1.50" and 18-digit numbers kept)."""
    import pandas as pd

    try:
        with warnings.catch_warnings():  # a first row with more cells than the header: pandas made its first
            warnings.simplefilter("error", pd.errors.ParserWarning)  # cell the index (or dropped the extra ones)
            df = pd.read_csv(path, dtype=str, keep_default_na=False, index_col=False)
    except pd.errors.EmptyDataError:
        raise _no_rows(task, path, "the file is empty, not even a header row") from None
    except (UnicodeDecodeError, ValueError) as e:  # pandas' ParserError is a ValueError; it names the line
        raise _unreadable(task, path, f"{type(e).__name__}: {e}") from None
    except pd.errors.ParserWarning:
        try:  # without a header row pandas names the first row with too many cells
            pd.read_csv(path, dtype=str, header=None, index_col=False)
            why = "a row has more cells than the header row"
        except ValueError as e:
            why = f"{type(e).__name__}: {str(e).strip()}"
        raise _unreadable(task, path, why) from None
    if df.empty:
        raise _no_rows(task, path, f"only the header row: {', '.join(map(str, df.columns))}")
    return [(f"row {i + 1} below the header", r) for i, r in enumerate(df.to_dict("records"))]


def _parquet_records(task: TaskSpec, path: Path) -> _Records:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except pa.ArrowException as e:
        raise _unreadable(task, path, f"{type(e).__name__}: {e}") from None
    if table.num_rows == 0:
        raise _no_rows(task, path, f"a table with the columns {', '.join(table.column_names)} and no rows")
    import numpy as np

    for i, field in enumerate(table.schema):  # a float32 0.1 is 0.10000000149011612 as a Python float: keep 0.1
        narrow = {pa.float32(): np.float32, pa.float16(): np.float16}.get(field.type)
        if narrow is not None:
            values = [None if v is None else float(str(narrow(v))) for v in table.column(i).to_pylist()]
            table = table.set_column(i, field.name, pa.array(values, pa.float64()))
    return [(f"row {i + 1}", r) for i, r in enumerate(table.to_pylist())]


def _compressed(task: TaskSpec, path: Path, kind: str) -> ConfigError:
    """A compressed file (by its name or, under a plain name, by its first bytes): said, with how to unpack it."""
    named = path.suffix.lower() == kind
    out = path.with_suffix("") if named and path.with_suffix("").suffix.lower() in _FORMATS else None
    out = out or path.with_name(f"{path.stem if named else path.name.removesuffix(path.suffix)}-unpacked"
                                f"{path.suffix if not named else '.jsonl'}")
    how = "" if named else f", though its name ends in {path.suffix}"
    return ConfigError(f"data.tasks['{task.name}']: '{path}' is compressed ({kind}{how}); rollwise reads only files that "
                       f"are not ({', '.join(_FORMATS)}): unpack it (`{_COMPRESSED[kind]} '{path}' > '{out}'`) and "
                       "point data.tasks[...].path at the unpacked file")


def _read_records(task: TaskSpec, path: Path) -> tuple[list[str], _Records]:
    """(column names, rows) of a file task's file."""
    if path.stat().st_size == 0:
        raise _no_rows(task, path, "the file is empty")
    suffix = path.suffix.lower()
    if suffix != ".parquet":  # a compressed file under a plain name (data.jsonl holding gzip bytes)
        with path.open("rb") as f:
            head = f.read(16)
        kind = next((k for magic, k in _MAGIC.items() if re.match(magic, head)), None)
        if kind is not None:
            raise _compressed(task, path, kind)
    if suffix == ".csv":
        records = _csv_records(task, path)
    elif suffix == ".parquet":
        records = _parquet_records(task, path)
    else:
        records = _json_records(task, path)
        if not records:
            raise _no_rows(task, path, "the file holds only blank lines or an empty list")
    return list(dict.fromkeys(k for _, r in records for k in r)), records


def _load_rows(task: TaskSpec) -> list[tuple[int, str, str]]:
    """(row number, question, answer) of the valid rows of a file task; the row number counts the file's
    rows from 0 (blank lines and a CSV header not counted)."""
    path = Path(task.path or "")
    if path.suffix.lower() in _COMPRESSED:
        raise _compressed(task, path, path.suffix.lower())
    if path.suffix.lower() not in _FORMATS:
        raise ConfigError(f"data.tasks['{task.name}']: '{path}' must end in {', '.join(_FORMATS)}")
    if not path.is_file():
        raise FileNotFoundError(f"data.tasks['{task.name}']: file '{path}' not found (looked for it from {Path.cwd()}); "
                                "check data.tasks[...].path")
    columns, records = _read_records(task, path)
    for col, key in ((task.prompt_column, "prompt_column"), (task.answer_column, "answer_column")):
        if col not in columns:
            raise ConfigError(
                f"data.tasks['{task.name}']: {key} '{col}' is not a column of '{path}'; "
                f"columns present: {', '.join(columns)}"
            )
    rows, skipped, dropped_turns, where, mended = [], 0, 0, [], []
    for i, (place, record) in enumerate(records):
        q, a = record.get(task.prompt_column), record.get(task.answer_column)
        if isinstance(q, list) and not q:  # an empty conversation: no question, skipped like an empty cell
            q = None
        if isinstance(q, list) and q and all(isinstance(m, dict) and "content" in m for m in q):
            users = [m for m in q if m.get("role") == "user"]  # a conversational prompt (TRL's format)
            dropped_turns += len(q) > 1
            q = users[-1]["content"] if users else None
        for value, col in ((q, task.prompt_column), (a, task.answer_column)):
            if isinstance(value, (list, dict)):
                raise ConfigError(f"data.tasks['{task.name}']: {place} of '{path}' holds a {type(value).__name__} in "
                                  f"column '{col}' ({str(value)[:80]}); a question and a gold answer are text (a "
                                  "prompt may also be a list of {role, content} messages): convert the column")
        for value, col in ((q, task.prompt_column), (a, task.answer_column)):
            if isinstance(value, bytes):  # a Parquet binary column (Spark, Impala write text so): str() gave "b'...'"
                try:
                    value.decode("utf-8")
                except UnicodeDecodeError:
                    raise ConfigError(f"data.tasks['{task.name}']: {place} of '{path}' holds bytes in column '{col}' "
                                      "that are not UTF-8 text; convert the column to text (UTF-8)") from None
        q, a = (v.decode("utf-8") if isinstance(v, bytes) else v for v in (q, a))
        question, answer = _cell(q), _cell(a)
        if question is not None and answer is not None and _SURROGATE.search(question + answer):
            mended.append(place)  # no tokenizer encodes half a character (TypeError far from the file, before)
            question, answer = _SURROGATE.sub("\ufffd", question), _SURROGATE.sub("\ufffd", answer)
        if question is None or answer is None:
            skipped += 1
            if skipped <= 5:
                where.append(f"{place}: no {'question' if question is None else 'gold answer'}")
        else:
            rows.append((i, question, answer))
    if not rows:
        raise ConfigError(f"data.tasks['{task.name}']: no valid rows in '{path}' ({skipped} rows lack a question or "
                          f"answer in the columns '{task.prompt_column}' and '{task.answer_column}'); check "
                          "prompt_column and answer_column, or the file")
    if mended:
        log.warning("task '%s': %d rows of '%s' hold a lone surrogate escape (\\ud800-\\udfff: half a character, as "
                    "in a string cut inside an emoji), which no tokenizer can encode; each is read as U+FFFD (first: "
                    "%s); fix them in the file", task.name, len(mended), path, mended[0])
    if dropped_turns:
        log.warning("task '%s': %d conversational prompts of '%s' have more than one message; each is trained on its "
                    "last user message alone (set data.system_prompt for a system message)", task.name, dropped_turns,
                    path)
    if skipped:
        log.warning("task '%s': skipped %d malformed rows of '%s' (missing/empty question or answer: %s%s); fill them "
                    "in or remove them", task.name, skipped, path, "; ".join(where), "; ..." if skipped > len(where) else "")
    return rows


def _file_item(task: TaskSpec, label: str, split: str, row: tuple[int, str, str]) -> PromptItem:
    i, question, answer = row
    return PromptItem(
        uid=f"{label}:{split}:{i}", task=task.name, question=question, answer=answer,
        entry={"question": question, "answer": answer},
    )


def _file_split(
    task: TaskSpec, label: str, n_train: int, n_eval: int, seed: int
) -> tuple[list[PromptItem], list[PromptItem]]:
    rows = _load_rows(task)
    random.Random(_seed(seed, label, "file")).shuffle(rows)
    cap = math.floor(MAX_FILE_EVAL_SHARE * len(rows))
    if n_eval > cap:
        log.warning("task '%s': wanted %d held-out rows, keeping %d (at most %d%% of the file's %d rows are held "
                    "out, so most stay for training)", label, n_eval, cap, round(MAX_FILE_EVAL_SHARE * 100), len(rows))
    n_eval = min(n_eval, cap)
    head, tail = rows[: len(rows) - n_eval], rows[len(rows) - n_eval :]
    if n_train > len(head):
        log.warning("task '%s': wanted %d training rows, the file has %d%s; using all", label, n_train, len(head),
                    f" besides the {n_eval} held out" if n_eval else "")
    train = [_file_item(task, label, "train", r) for r in head]  # build_items takes n_train of those not held out
    return train, [_file_item(task, label, "eval", r) for r in tail]


# ------------------------------------------------------------------ the mixture


def build_items(cfg: DataConfig, seed: int, empty_share: str | None = "train") -> tuple[list[PromptItem], list[PromptItem]]:
    """(train, eval) items of the mixture `cfg.tasks`; deterministic in `seed`."""
    weights = [t.weight for t in cfg.tasks]
    n_train, n_eval = allocate(cfg.train_size, weights), allocate(cfg.eval_size, weights)
    labels = _labels(cfg.tasks)
    # a task whose weight was accepted but whose share rounds to 0, said for the items the caller uses
    # (`empty_share`: "train" for training, "eval" for `rollwise eval`, which trains nothing; None: not said)
    if empty_share is not None:
        key, shares, what = {"train": ("train_size", n_train, "training"), "eval": ("eval_size", n_eval, "held-out")}[empty_share]
        for k in (k for k, n in enumerate(shares) if n == 0):
            log.warning("task '%s': no %s items: its share of data.%s=%d (weight %g of %g) rounds to 0; raise data.%s "
                        "or its weight", labels[k], what, key, getattr(cfg, key), weights[k], sum(weights), key)
    file_parts: dict[int, tuple[list[PromptItem], list[PromptItem]]] = {}
    for k, task in enumerate(cfg.tasks):
        if task.path:
            file_parts[k] = _file_split(task, labels[k], n_train[k], n_eval[k], seed)
    # Held-out items first (an unbiased sample), then training items that avoid their questions.
    seen: set[str] = set()
    evals: list[PromptItem] = []
    for k, task in enumerate(cfg.tasks):
        if task.path:
            repeats = []
            for it in file_parts[k][1]:
                if it.question not in seen:
                    seen.add(it.question)
                    evals.append(it)
                else:
                    repeats.append(it)
            if repeats:
                log.warning("task '%s': %d held-out rows left out: their question is held out already (repeated in "
                            "the file, or asked by an earlier task's held-out items; first: %r)", labels[k],
                            len(repeats), repeats[0].question[:80])
        else:
            evals.extend(_rg_eval(task, labels[k], n_eval[k], seed, seen))
    train: list[PromptItem] = []
    for k, task in enumerate(cfg.tasks):
        if task.path:
            rows = file_parts[k][0]
            kept = [it for it in rows if it.question not in seen][: n_train[k]]
            if rows and n_train[k] and not kept:  # a run never starts without the task's rows (nor on no rows at all)
                raise ConfigError(
                    f"data.tasks['{labels[k]}']: no training rows left in '{task.path}': each of its "
                    f"{len(rows)} rows not held out asks a question that is held out ({len({it.question for it in rows})}"
                    " distinct questions among them; a question repeated in the file, or asked by another task's "
                    "held-out items), and training never sees a held-out question; give the rows distinct questions, "
                    "or set data.eval_size=0 to hold nothing out")
            if len(kept) < min(n_train[k], len(rows)):
                log.warning("task '%s': %d training rows instead of %d: %d rows of the file ask a held-out question "
                            "(a question repeated in the file, or asked by another task's held-out items) and are "
                            "dropped so that training and eval do not overlap", labels[k], len(kept),
                            min(n_train[k], len(rows)), sum(it.question in seen for it in rows))
            train.extend(kept)
        else:
            train.extend(_rg_train(task, labels[k], n_train[k], seed, seen))
    random.Random(_seed(seed, "order")).shuffle(train)
    return train, evals
