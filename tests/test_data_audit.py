"""Malformed file rows and mixtures: each case was misread, dropped without a word, or crashed before."""

from __future__ import annotations

import json
import logging
import sys
from collections import Counter
from pathlib import Path

import pytest

try:
    import rollwise  # noqa: F401
except ImportError:  # running from a checkout without an installed package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from test_input_files import answers

from rollwise.config import ConfigError, DataConfig, TaskSpec
from rollwise.data import build_items


def test_a_csv_row_with_an_unquoted_comma_is_an_error_naming_its_line(tmp_path: Path) -> None:
    """pandas took the first cell of such rows for an index: the question came back as ' 2 and 3 summed?' (and a
    following well-formed row lost its answer), silently."""
    for name, text in [("all.csv", "prompt,answer\nWhat is 1, 2 and 3 summed?,6\nWhat is 4, 5 and 6 summed?,15\n"),
                       ("first.csv", "prompt,answer\nWhat is 1, 2 and 3 summed?,6\nb,2\n")]:
        (tmp_path / name).write_text(text)
        with pytest.raises(ConfigError, match=rf"(?s){name}.*Expected 2 fields in line 2, saw 3.*quote cells that hold "
                                              "commas"):
            answers(tmp_path / name)
    fine = tmp_path / "fine.csv"
    fine.write_bytes(b'\xef\xbb\xbfprompt,answer\r\n"What is 1, 2 and 3 summed?",6\r\nb,2\r\n\r\n')
    assert answers(fine) == {"What is 1, 2 and 3 summed?": "6", "b": "2"}


def test_jsonl_strings_may_hold_unicode_line_separators(tmp_path: Path) -> None:
    """splitlines() cut a line at U+2028 / U+0085 inside a string: a valid file was refused as invalid JSON."""
    rows = [{"prompt": "one\u2028two", "answer": "1"}, {"prompt": "b\x85c", "answer": "2"}, {"prompt": "d", "answer": 3}]
    path = tmp_path / "sep.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    assert answers(path) == {"one\u2028two": "1", "b\x85c": "2", "d": "3"}
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a\u2028b", "answer": 1}\r\n\r\n{"prompt": "c", answer: 2}\r\n', encoding="utf-8")
    with pytest.raises(ConfigError, match=r"not valid JSON at line 3, column"):
        answers(bad)


def test_json_columns_are_matched_by_row_number(tmp_path: Path) -> None:
    """Columns of a JSON object were paired by position: {"0": .., "1": ..} beside {"1": .., "0": ..} swapped answers."""
    path = tmp_path / "columns.json"
    path.write_text('{"prompt": {"0": "a", "1": "b"}, "answer": {"1": "B", "0": "A"}}')
    assert answers(path) == {"a": "A", "b": "B"}
    ragged = tmp_path / "ragged.json"
    ragged.write_text('{"prompt": {"0": "a", "1": "b"}, "answer": {"0": "A", "2": "B"}}')
    with pytest.raises(ConfigError, match=r"ragged.json' holds a dict in column 'prompt'"):
        answers(ragged)


def test_skipped_rows_are_named(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "gaps.jsonl"
    path.write_text('{"prompt": "a", "answer": 1}\n{"prompt": "b", "answer": null}\n\n{"prompt": " ", "answer": 4}\n'
                    '{"prompt": "c", "answer": 3}\n')
    with caplog.at_level(logging.WARNING, logger="rollwise.data.tasks"):
        assert answers(path) == {"a": "1", "c": "3"}
    assert "skipped 2 malformed rows" in caplog.text
    assert "line 2: no gold answer" in caplog.text and "line 4: no question" in caplog.text


def test_repeated_questions_in_a_file_are_told_and_training_keeps_its_size(tmp_path: Path,
                                                                             caplog: pytest.LogCaptureFixture) -> None:
    """Held-out and training rows dropped for a repeated question were dropped without a word, and training got
    fewer rows than configured even where the file had more."""
    path = tmp_path / "dup.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"q{i % 10}", "answer": str(i % 10)}) + "\n" for i in range(50)))
    with caplog.at_level(logging.WARNING, logger="rollwise.data.tasks"):
        train, evals = build_items(DataConfig(tasks=[TaskSpec(name="f", path=str(path))], train_size=40,
                                              eval_size=10), seed=0)
    assert not {i.question for i in train} & {i.question for i in evals}
    assert len(evals) < 10 and f"{10 - len(evals)} held-out rows left out" in caplog.text
    assert len(train) < 40 and f"{len(train)} training rows instead of 40" in caplog.text
    caplog.clear()
    two = [TaskSpec(name="f", path=str(path)), TaskSpec(name="g", path=str(path))]
    with caplog.at_level(logging.WARNING, logger="rollwise.data.tasks"):
        train, evals = build_items(DataConfig(tasks=two, train_size=20, eval_size=4), seed=0)
    assert not {i.question for i in train} & {i.question for i in evals}
    assert Counter(i.task for i in train) == {"f": 10, "g": 10}  # rows enough remain: the share is filled
    assert "held-out rows left out" in caplog.text


def test_a_parameter_that_fails_while_generating_is_a_config_error() -> None:
    """min_digits: 1.5 passes reasoning-gym's checks and failed in item generation with a bare ValueError."""
    spec = TaskSpec(name="chain_sum", params={"min_digits": 1.5})
    with pytest.raises(ConfigError, match=r"data.tasks\['chain_sum'\].params .*min_digits.*non-integer"):
        build_items(DataConfig(tasks=[spec], train_size=5, eval_size=1), seed=0)


def test_parquet_float32_answers_keep_their_value(tmp_path: Path) -> None:
    """A float32 0.1 came back as '0.10000000149011612', which a correct '0.1' does not match."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "f32.parquet"
    pq.write_table(pa.table({"prompt": ["a", "b", "c", "d"],
                             "answer": pa.array([0.1, 2.0, None, 2.5], pa.float32())}), path)
    assert answers(path) == {"a": "0.1", "b": "2", "d": "2.5"}
