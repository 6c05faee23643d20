"""Data-layer audit (tenth): uids that collided, Parquet byte cells read as "b'...'", a system prompt a chat
template dropped without a word. Each test failed on the code before its fix."""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import pytest

try:
    import rollwise  # noqa: F401
except ImportError:  # running from a checkout without an installed package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from test_data import ITEM, tiny_tokenizer

from rollwise.config import ConfigError, DataConfig, TaskSpec
from rollwise.data import build_items, encode_prompts, format_prompt


def _jsonl(path: Path, prefix: str, n: int) -> Path:
    path.write_text("".join(json.dumps({"prompt": f"{prefix}{i}", "answer": str(i)}) + "\n" for i in range(n)))
    return path


def test_a_task_named_like_a_repeat_label_gets_uids_of_its_own(tmp_path: Path) -> None:
    """Tasks a, a and a#2 were all labelled so that the second and third shared "a#2": their uids collided
    ("a#2:train:3" twice), and the planner, which keys prompts on uids, merged two different questions."""
    a, b, c = _jsonl(tmp_path / "a.jsonl", "p", 10), _jsonl(tmp_path / "b.jsonl", "q", 10), _jsonl(tmp_path / "c.jsonl",
                                                                                                    "r", 10)
    for names in (["a", "a", "a#2"], ["a", "a#2", "a"]):
        tasks = [TaskSpec(name=n, path=str(p)) for n, p in zip(names, (a, b, c))]
        train, evals = build_items(DataConfig(tasks=tasks, train_size=30, eval_size=6), seed=0)
        assert len(train) == 24 and len(evals) == 6  # each file: 10 rows, 2 held out (20%), 8 trained on
        uids = Counter(it.uid for it in train + evals)
        assert [u for u, n in uids.items() if n > 1] == []
        assert len({it.uid.rsplit(":", 2)[0] for it in train}) == 3  # three labels, one per task
    # a mixture without a clash keeps the labels it always had (same items, same uids: a run's digest holds)
    tasks = [TaskSpec(name="a", path=str(a)), TaskSpec(name="a", path=str(b))]
    train, _ = build_items(DataConfig(tasks=tasks, train_size=20, eval_size=0), seed=0)
    assert {it.uid.rsplit(":", 2)[0] for it in train} == {"a", "a#2"}


def test_parquet_byte_columns_are_read_as_text(tmp_path: Path) -> None:
    """Parquet written by Spark or Impala without the UTF8 annotation stores text as binary; the question came back
    as "b'What is 2+2?'" and the gold answer as "b'4'", so nothing could score 1."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "bin.parquet"
    pq.write_table(pa.table({"prompt": pa.array([f"What is {i}+{i}?".encode() for i in range(5)], pa.binary()),
                             "answer": pa.array([str(2 * i).encode() for i in range(5)], pa.large_binary()),
                             "blob": pa.array([b"\xff\xfe"] * 5, pa.binary())}), path)  # other columns: not read
    train, _ = build_items(DataConfig(tasks=[TaskSpec(name="p", path=str(path))], train_size=5, eval_size=0), seed=0)
    assert {it.question: it.answer for it in train} == {f"What is {i}+{i}?": str(2 * i) for i in range(5)}
    bad = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"prompt": pa.array([b"ok", b"caf\xe9"], pa.binary()), "answer": ["1", "2"]}), bad)
    with pytest.raises(ConfigError, match=r"row 2 of '.*bad.parquet' holds bytes in column 'prompt' that are not UTF-8"):
        build_items(DataConfig(tasks=[TaskSpec(name="p", path=str(bad))], train_size=2, eval_size=0), seed=0)


# Phi-3-mini's first template: a system message is neither rendered nor refused
DROPS_SYSTEM = ("{% for m in messages %}{% if m['role'] == 'user' %}<|user|> {{ m['content'] }}\n{% endif %}"
                "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}")


def test_a_system_prompt_the_template_drops_goes_in_front_of_the_question() -> None:
    """The module promises the system prompt in front of the user message where the template refuses a system
    message; a template that drops it without an error lost it (and with it the answer format it may ask for)."""
    cfg = DataConfig(instruction="Be brief.", system_prompt="Be")
    tok = tiny_tokenizer(DROPS_SYSTEM)
    assert format_prompt(ITEM, tok, cfg) == "<|user|> Be\n\nWhat is 2 + 2 ?\nBe brief.\n<|assistant|>"
    ids, dropped = encode_prompts([ITEM], tok, cfg)  # the tokens are of that text: <|user|> Be What is 2 + 2 ? ...
    assert ids == [[1, 9, 4, 5, 6, 7, 6, 8, 9, 10, 3]] and dropped == []
    # no system prompt, or a template that renders it: as before
    assert format_prompt(ITEM, tok, DataConfig(instruction="Be brief.")) == "<|user|> What is 2 + 2 ?\nBe brief.\n<|assistant|>"
    from test_data import TEMPLATE

    assert format_prompt(ITEM, tiny_tokenizer(TEMPLATE), cfg) == ("<|system|> Be\n<|user|> What is 2 + 2 ?\nBe brief.\n"
                                                                  "<|assistant|>")
    # a template with a default system message (SmolLM2's) given that very one: rendered, not taken for dropped
    default = "{% if messages[0]['role'] != 'system' %}<|system|> Be\n{% endif %}" + TEMPLATE
    assert format_prompt(ITEM, tiny_tokenizer(default), cfg) == ("<|system|> Be\n<|user|> What is 2 + 2 ?\nBe brief.\n"
                                                                 "<|assistant|>")


def test_a_task_whose_share_rounds_to_nothing_is_told(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Weights 100 and 1 with data.train_size=50: shares 49.5 and 0.495, largest remainder gives [50, 0]; the file
    task was read, accepted, and gave no training (nor held-out) item without a word."""
    import logging

    path = _jsonl(tmp_path / "f.jsonl", "q", 20)
    cfg = DataConfig(tasks=[TaskSpec(name="chain_sum", weight=100), TaskSpec(name="f", path=str(path), weight=1)],
                     train_size=50, eval_size=5)
    with caplog.at_level(logging.WARNING, logger="rollwise.data.tasks"):
        train, evals = build_items(cfg, seed=0)
    assert Counter(it.task for it in train) == {"chain_sum": 50} and Counter(it.task for it in evals) == {"chain_sum": 5}
    assert "task 'f': no training items: its share of data.train_size=50 (weight 1 of 101) rounds to 0" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="rollwise.data.tasks"):
        build_items(cfg.model_copy(update={"train_size": 101}), seed=0)  # shares 100 and 1: nothing to say
    assert "no training items" not in caplog.text
    # `rollwise eval` trains nothing: it is told of the held-out share it uses (5 -> [5, 0]), not of training's
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="rollwise.data.tasks"):
        build_items(cfg, seed=0, empty_share="eval")
    assert "no training items" not in caplog.text
    assert "task 'f': no held-out items: its share of data.eval_size=5 (weight 1 of 101) rounds to 0" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="rollwise.data.tasks"):
        build_items(cfg, seed=0, empty_share=None)  # the run's training items, rebuilt by `rollwise eval`
    assert "no " not in caplog.text


def test_a_lone_surrogate_escape_is_mended_and_told(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """JSON lets "\\ud83d" stand alone (a string cut inside an emoji); json read it as half a character, which no
    tokenizer encodes: encode_prompts stopped with "TypeError: TextEncodeInput must be Union[...]", naming no file
    or row (and the checkpoint's data digest could not be written). Now U+FFFD, said with the row."""
    import logging

    from test_data import TEMPLATE

    path = tmp_path / "cut.jsonl"
    path.write_text('{"prompt": "What is 2 + 2 ? \\ud83d", "answer": "4"}\n\n{"prompt": "b \\ud83d\\ude00", "answer": '
                    '"\\udc00"}\n{"prompt": "c", "answer": "3"}\n')
    with caplog.at_level(logging.WARNING, logger="rollwise.data.tasks"):
        train, _ = build_items(DataConfig(tasks=[TaskSpec(name="f", path=str(path))], train_size=3, eval_size=0),
                               seed=0)
    assert {it.uid: (it.question, it.answer) for it in train} == {
        "f:train:0": ("What is 2 + 2 ? \ufffd", "4"), "f:train:1": ("b \U0001f600", "\ufffd"), "f:train:2": ("c", "3")}
    assert "task 'f': 2 rows of" in caplog.text and "(first: line 1)" in caplog.text
    ids, dropped = encode_prompts(train, tiny_tokenizer(TEMPLATE), DataConfig())
    assert len(ids) == 3 and dropped == []
