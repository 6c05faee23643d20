"""What a run reads from the user's files: a file task's rows as written, and a model folder's tokenizer."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

try:
    import rollwise  # noqa: F401
except ImportError:  # running from a checkout without an installed package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from rollwise.config import ConfigError, DataConfig, TaskSpec
from rollwise.data import build_items
from rollwise.models import ModelError, load_tokenizer


def answers(path: Path) -> dict[str, str]:
    """question -> gold answer of every row of a file task."""
    train, evals = build_items(DataConfig(tasks=[TaskSpec(name="f", path=str(path))], train_size=100, eval_size=0),
                               seed=0)
    return {i.question: i.answer for i in train + evals}


# ------------------------------------------------------------------ gold answers are read as written


def test_json_numbers_keep_every_digit(tmp_path: Path) -> None:
    """A float beside a big integer made the column float64: 9007199254740993 came back ...992."""
    path = tmp_path / "mixed.jsonl"
    path.write_text('{"prompt": "a", "answer": 2.5}\n{"prompt": "b", "answer": 9007199254740993}\n'
                    '{"prompt": "c", "answer": 1.50}\n{"prompt": "d", "answer": 123456789012345678901234567890}\n')
    assert answers(path) == {"a": "2.5", "b": "9007199254740993", "c": "1.50", "d": "123456789012345678901234567890"}
    both = tmp_path / "both.jsonl"  # numbers and strings in one column (refused before: "changed from number to string")
    both.write_text('{"prompt": "a", "answer": 12}\n{"prompt": "b", "answer": "x"}\n{"prompt": 7, "answer": -3}\n')
    assert answers(both) == {"a": "12", "b": "x", "7": "-3"}
    listed = tmp_path / "listed.json"
    listed.write_text('[\n  {"prompt": "a", "answer": 2.5},\n  {"prompt": "b", "answer": 9007199254740993}\n]\n')
    assert answers(listed) == {"a": "2.5", "b": "9007199254740993"}
    columns = tmp_path / "columns.json"  # pandas' DataFrame.to_json()
    columns.write_text('{"prompt": {"0": "a", "1": "b"}, "answer": {"0": 0.10, "1": 9007199254740993}}')
    assert answers(columns) == {"a": "0.10", "b": "9007199254740993"}


def test_csv_cells_are_text_as_written(tmp_path: Path) -> None:
    """pandas read '007' as 7, '1.50' as 1.5 and 123456789012345678 as ...680."""
    path = tmp_path / "typed.csv"
    path.write_text("prompt,answer\na,007\nb,1.50\nc,123456789012345678\n1,2\n")
    assert answers(path) == {"a": "007", "b": "1.50", "c": "123456789012345678", "1": "2"}
    text = tmp_path / "text.csv"  # a text cell made the column text already; "NA" is an answer, not a gap
    text.write_text("prompt,answer\na,NA\nb,1.50\n")
    assert answers(text) == {"a": "NA", "b": "1.50"}


def test_parquet_integers_are_exact(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "ints.parquet"
    pq.write_table(pa.table({"prompt": ["a", "b"], "answer": [9007199254740993, 7]}), path)
    assert answers(path) == {"a": "9007199254740993", "b": "7"}


# ------------------------------------------------------------------ files without rows


@pytest.mark.parametrize(("name", "text", "what"), [
    ("empty.jsonl", "", "the file is empty"),
    ("blank.jsonl", "\n  \n", "only blank lines"),
    ("empty.json", "[]", "an empty list"),
    ("header.csv", "prompt,answer\n", "only the header row: prompt, answer"),
    ("empty.csv", "", "the file is empty"),
])
def test_a_file_without_rows_says_so(tmp_path: Path, name: str, text: str, what: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ConfigError, match=r"holds no rows") as e:
        answers(path)
    assert what in str(e.value) and "add one row per item" in str(e.value)
    assert "StopIteration" not in str(e.value) and "Instruction" not in str(e.value)


def test_a_parquet_table_without_rows_says_so(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "none.parquet"
    pq.write_table(pa.table({"prompt": pa.array([], pa.string()), "answer": pa.array([], pa.string())}), path)
    with pytest.raises(ConfigError, match=r"holds no rows \(a table with the columns prompt, answer and no rows\)"):
        answers(path)


# ------------------------------------------------------------------ rows are named by their place in the file


def test_a_bad_row_is_named_by_its_line(tmp_path: Path) -> None:
    cases = [
        ("dictrow.jsonl", '{"prompt": "a", "answer": "1"}\n\n{"prompt": "b", "answer": "2"}\n'
                          '{"prompt": "c", "answer": {"x": 1}}\n', r"line 4 of .*dictrow.jsonl' holds a dict in column 'answer'"),
        ("dictrow.json", '[{"prompt": "a", "answer": "1"}, {"prompt": "b", "answer": ["2"]}]',
         r"item 2 of the list of .*dictrow.json' holds a list"),
        ("broken.jsonl", '{"prompt": "a", "answer": "1"}\n{"prompt": "b", answer: 2}\n',
         r"not valid JSON at line 2, column 17"),
        ("scalar.jsonl", '{"prompt": "a", "answer": "1"}\n5\n', r"line 2 is '5', not a JSON object"),
    ]
    for name, text, message in cases:
        (tmp_path / name).write_text(text)
        with pytest.raises(ConfigError, match=message):
            answers(tmp_path / name)


def test_row_numbers_in_uids_count_rows_from_0(tmp_path: Path) -> None:
    """uids keep the numbering runs and prior_counts files already use: rows from 0, blank lines skipped."""
    path = tmp_path / "d.jsonl"
    path.write_text('{"prompt": "a", "answer": 1}\n\n{"prompt": "b", "answer": 2}\n')
    train, _ = build_items(DataConfig(tasks=[TaskSpec(name="f", path=str(path))], train_size=2, eval_size=0), seed=0)
    assert sorted(i.uid for i in train) == ["f:train:0", "f:train:1"]


# ------------------------------------------------------------------ tokenizers


def model_copy(src: Path, dst: Path, drop: tuple[str, ...] = (), no_eos: bool = False) -> Path:
    shutil.copytree(src, dst)
    for name in drop:
        (dst / name).unlink()
    if no_eos:
        for name in ("config.json", "generation_config.json"):
            cfg = json.loads((dst / name).read_text())
            cfg["eos_token_id"] = None
            (dst / name).write_text(json.dumps(cfg))
    return dst


def test_a_tokenizer_without_pad_or_eos_pads_with_the_models_eos(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Without tokenizer_config.json the tokenizer names no pad or eos token: generation then failed mid-run
    (torch.full(fill_value=None))."""
    folder = model_copy(tiny_model_dir, tmp_path / "m", drop=("tokenizer_config.json",))
    tok = load_tokenizer(str(folder))
    assert tok.pad_token == "<|im_end|>" and tok.pad_token_id == 1  # the model's eos_token_id
    assert load_tokenizer(str(tiny_model_dir)).pad_token == "<pad>"  # a pad token of its own is kept


def test_a_tokenizer_with_nothing_to_pad_with_is_an_error(tiny_model_dir: Path, tmp_path: Path) -> None:
    folder = model_copy(tiny_model_dir, tmp_path / "m", drop=("tokenizer_config.json",), no_eos=True)
    with pytest.raises(ModelError, match=r"has no pad_token and no eos_token .*Set pad_token or eos_token"):
        load_tokenizer(str(folder))


def test_missing_tokenizer_files_are_named(tiny_model_dir: Path, tmp_path: Path) -> None:
    bare = model_copy(tiny_model_dir, tmp_path / "bare", drop=("tokenizer.json", "tokenizer_config.json"))
    with pytest.raises(ModelError, match=r"has no tokenizer: none of tokenizer.json, tokenizer_config.json"):
        load_tokenizer(str(bare))
    no_vocab = model_copy(tiny_model_dir, tmp_path / "no_vocab", drop=("tokenizer.json",))
    with pytest.raises(ModelError) as e:
        load_tokenizer(str(no_vocab))
    assert "sentencepiece or tiktoken" in str(e.value)  # transformers' reasons, not only its first line
    assert "holds none of tokenizer.json, tokenizer.model" in str(e.value)
