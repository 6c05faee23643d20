"""Task mixtures, file tasks and prompt formatting (expected values written by hand)."""

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

from rollwise.config import ConfigError, DataConfig, TaskSpec
from rollwise.data import build_items, encode_prompts, format_prompt
from rollwise.data.tasks import allocate
from rollwise.types import PromptItem

SMALL = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}


def rg_cfg(train: int, evals: int, *tasks: tuple[str, float, dict]) -> DataConfig:
    specs = [TaskSpec(name=n, weight=w, params=p) for n, w, p in tasks]
    return DataConfig(tasks=specs, train_size=train, eval_size=evals)


# ------------------------------------------------------------------ reasoning-gym mixtures


def test_allocate_is_proportional_with_largest_remainder() -> None:
    assert allocate(10, [1, 1, 1]) == [4, 3, 3]
    assert allocate(7, [2, 1]) == [5, 2]
    assert allocate(5, [1, 1, 2]) == [1, 1, 3]
    assert allocate(0, [1, 2]) == [0, 0]


def test_mixture_proportions_and_unique_uids() -> None:
    cfg = rg_cfg(40, 8, ("chain_sum", 3.0, {}), ("gcd", 1.0, {}))
    train, evals = build_items(cfg, seed=1)
    assert Counter(i.task for i in train) == {"chain_sum": 30, "gcd": 10}
    assert Counter(i.task for i in evals) == {"chain_sum": 6, "gcd": 2}
    assert len({i.uid for i in train + evals}) == 48
    first = next(i for i in train if i.task == "gcd")
    assert first.entry["metadata"]["source_dataset"] == "gcd" and first.answer == first.entry["answer"]
    assert first.uid.startswith("gcd:train:")


def test_determinism_by_seed() -> None:
    cfg = rg_cfg(30, 6, ("chain_sum", 1.0, {}), ("products", 1.0, {}))
    a, b, c = build_items(cfg, seed=3), build_items(cfg, seed=3), build_items(cfg, seed=4)
    assert [(i.uid, i.question) for i in a[0] + a[1]] == [(i.uid, i.question) for i in b[0] + b[1]]
    assert [i.question for i in a[0]] != [i.question for i in c[0]]


def test_eval_never_overlaps_train_and_is_refilled() -> None:
    # 1-digit two-term sums: a small question space, so raw eval draws repeat training questions
    cfg = rg_cfg(150, 20, ("chain_sum", 1.0, SMALL))
    train, evals = build_items(cfg, seed=0)
    assert len(train) == 150 and len(evals) == 20
    assert not {i.question for i in train} & {i.question for i in evals}
    assert len({i.question for i in evals}) == 20
    dropped = [int(i.uid.rsplit(":", 1)[1]) for i in evals]
    assert dropped != list(range(20))  # some candidates were rejected and replaced


def test_small_question_space_gives_fewer_eval_items_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    params = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}
    cfg = rg_cfg(600, 150, ("products", 1.0, params))  # at most 100 distinct questions
    with caplog.at_level(logging.WARNING, logger="rollwise.data.tasks"):
        train, evals = build_items(cfg, seed=0)
    assert 50 < len(evals) < 150
    assert len({i.question for i in evals}) == len(evals)
    assert not {i.question for i in train} & {i.question for i in evals}
    assert "only" in caplog.text and "products" in caplog.text


def test_eval_is_an_unbiased_sample_even_when_training_covers_the_space() -> None:
    # 1-2 digit sums: a large training set covers nearly every 1-digit question. Eval is drawn
    # first, so it keeps its natural share of 1-digit questions (training avoids them instead).
    params = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2}
    train, evals = build_items(rg_cfg(3000, 200, ("chain_sum", 1.0, params)), seed=0)
    one_digit = sum(e.entry["metadata"]["num_digits"] == 1 for e in evals) / len(evals)
    assert 0.3 < one_digit < 0.7, one_digit
    assert not {i.question for i in train} & {i.question for i in evals}


def test_unknown_generator_suggests_close_names() -> None:
    with pytest.raises(ValueError, match="chain_summ") as err:
        build_items(rg_cfg(4, 0, ("chain_summ", 1.0, {})), seed=0)
    assert "chain_sum" in str(err.value).replace("'chain_summ'", "")
    assert "reasoning_gym.factory" in str(err.value)


def test_bad_params_name_task_and_param() -> None:
    with pytest.raises(ConfigError, match=r"chain_sum.*min_termz") as err:
        build_items(rg_cfg(4, 0, ("chain_sum", 1.0, {"min_termz": 2})), seed=0)
    assert "min_terms" in str(err.value)  # the allowed list
    with pytest.raises(ConfigError, match=r"chain_sum.*max_terms must be >= min_terms"):
        build_items(rg_cfg(4, 0, ("chain_sum", 1.0, {"min_terms": 5, "max_terms": 2})), seed=0)


# ------------------------------------------------------------------ file tasks

GOOD = [{"prompt": f"What is {i} + {i}?", "answer": 2 * i} for i in range(10)]
MALFORMED = [{"prompt": "", "answer": 1}, {"prompt": "No answer?", "answer": None}, {"prompt": "   ", "answer": 3}]


def write(tmp_path: Path, fmt: str) -> Path:
    rows = GOOD[:5] + MALFORMED + GOOD[5:]
    path = tmp_path / f"data.{fmt}"
    if fmt == "jsonl":
        path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    elif fmt == "csv":
        lines = ["prompt,answer"] + [f"{r['prompt']},{'' if r['answer'] is None else r['answer']}" for r in rows]
        path.write_text("\n".join(lines) + "\n")
    else:
        from datasets import Dataset

        Dataset.from_list(rows).to_parquet(str(path))
    return path


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet"])
def test_file_task(tmp_path: Path, fmt: str, caplog: pytest.LogCaptureFixture) -> None:
    cfg = DataConfig(tasks=[TaskSpec(name="mine", path=str(write(tmp_path, fmt)))], train_size=100, eval_size=5)
    with caplog.at_level(logging.WARNING, logger="rollwise.data.tasks"):
        train, evals = build_items(cfg, seed=0)
    assert "skipped 3 malformed rows" in caplog.text
    assert len(evals) == 2 and len(train) == 8  # eval capped at 20% of the 10 valid rows, and said so
    assert "wanted 5 held-out rows, keeping 2" in caplog.text
    expected = {f"What is {i} + {i}?": str(2 * i) for i in range(10)}
    assert {i.question: i.answer for i in train + evals} == expected
    assert not {i.question for i in train} & {i.question for i in evals}
    assert all(i.entry == {"question": i.question, "answer": i.answer} for i in train + evals)
    assert len({i.uid for i in train + evals}) == 10
    assert all(i.uid.startswith("mine:train:") for i in train) and all(i.task == "mine" for i in evals)
    again = build_items(cfg, seed=0)
    assert [i.uid for i in again[0]] == [i.uid for i in train]


def test_file_and_generator_mixture(tmp_path: Path) -> None:
    spec = TaskSpec(name="mine", path=str(write(tmp_path, "jsonl")))
    cfg = DataConfig(tasks=[spec, TaskSpec(name="gcd", weight=3.0)], train_size=20, eval_size=4)
    train, evals = build_items(cfg, seed=2)
    assert Counter(i.task for i in train) == {"mine": 5, "gcd": 15}
    assert Counter(i.task for i in evals) == {"mine": 1, "gcd": 3}


def test_file_task_reads_the_columns_it_is_told(tmp_path: Path) -> None:
    path = tmp_path / "renamed.jsonl"
    path.write_text("".join(json.dumps({"problem": f"What is {i} x 3?", "sol": str(3 * i), "answer": "decoy"}) + "\n"
                            for i in range(10)))
    spec = TaskSpec(name="m", path=str(path), prompt_column="problem", answer_column="sol")
    train, evals = build_items(DataConfig(tasks=[spec], train_size=8, eval_size=2), seed=0)
    assert {i.question: i.answer for i in train + evals} == {f"What is {i} x 3?": str(3 * i) for i in range(10)}
    with pytest.raises(ConfigError, match=r"answer_column 'solution'"):
        build_items(DataConfig(tasks=[spec.model_copy(update={"answer_column": "solution"})]), seed=0)


def test_file_task_errors(tmp_path: Path) -> None:
    path = write(tmp_path, "jsonl")
    with pytest.raises(ConfigError, match=r"prompt_column 'problem'.*columns present: prompt, answer"):
        build_items(DataConfig(tasks=[TaskSpec(name="m", path=str(path), prompt_column="problem")]), seed=0)
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        build_items(DataConfig(tasks=[TaskSpec(name="m", path=str(tmp_path / "nope.jsonl"))]), seed=0)
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(json.dumps(r) for r in MALFORMED) + "\n")
    with pytest.raises(ConfigError, match="no valid rows"):
        build_items(DataConfig(tasks=[TaskSpec(name="m", path=str(bad))]), seed=0)
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"prompt": "a", "answer": "1"}\n{"prompt": "b", answer: 2\n')
    with pytest.raises(ConfigError, match=r"could not read .*broken.jsonl.*JSON.*one JSON object per line"):
        build_items(DataConfig(tasks=[TaskSpec(name="m", path=str(broken))]), seed=0)
    broken_csv = tmp_path / "broken.csv"  # the hint fits the format (it said "one JSON object per line" here too)
    broken_csv.write_text('prompt,answer\n"a,1\nb,2,3,4\n')
    with pytest.raises(ConfigError, match=r"could not read .*broken.csv.*a header row") as e:
        build_items(DataConfig(tasks=[TaskSpec(name="m", path=str(broken_csv))]), seed=0)
    assert "JSON" not in str(e.value).split(";")[-1]


def test_conversational_prompts_are_read_and_list_cells_are_refused(tmp_path: Path, caplog) -> None:
    rows = [{"prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": f"What is {i} + 1?"}],
             "answer": i + 1} for i in range(5)]
    rows += [{"prompt": [{"role": "user", "content": f"What is {i} + 1?"}], "answer": i + 1} for i in range(5, 10)]
    path = tmp_path / "chat.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with caplog.at_level(logging.WARNING, logger="rollwise.data.tasks"):
        train, evals = build_items(DataConfig(tasks=[TaskSpec(name="chat", path=str(path))], train_size=8,
                                              eval_size=2), seed=0)
    assert {i.question: i.answer for i in train + evals} == {f"What is {i} + 1?": str(i + 1) for i in range(10)}
    assert "5 conversational prompts" in caplog.text and "last user message" in caplog.text
    listed = tmp_path / "listed.jsonl"
    listed.write_text("".join(json.dumps({"prompt": f"q{i}", "answer": [str(i), "x"]}) + "\n" for i in range(5)))
    with pytest.raises(ConfigError, match=r"line 1 of .*listed.jsonl' holds a list in column 'answer'"):
        build_items(DataConfig(tasks=[TaskSpec(name="l", path=str(listed))]), seed=0)


def test_a_path_option_expands_the_home_folder(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in GOOD))
    from rollwise.config import load_config

    cfg = load_config(None, ["data.tasks=[{name: m, path: ~/d.jsonl}]", "run.output_dir=~/runs",
                             "model.cache_dir=~/cache", "planner.prior_counts=~/p.jsonl"])
    assert cfg.data.tasks[0].path == str(tmp_path / "d.jsonl") and cfg.run.output_dir == str(tmp_path / "runs")
    assert (cfg.model.cache_dir, cfg.planner.prior_counts) == (str(tmp_path / "cache"), str(tmp_path / "p.jsonl"))
    assert len(build_items(cfg.data.model_copy(update={"train_size": 8, "eval_size": 2}), seed=0)[0]) == 8


# ------------------------------------------------------------------ prompts

TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
NO_SYSTEM = "{% if messages[0]['role'] == 'system' %}{{ raise_exception('no system role') }}{% endif %}" + TEMPLATE


def tiny_tokenizer(template: str | None) -> object:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["[UNK]", "<|user|>", "<|system|>", "<|assistant|>", "What", "is", "2", "+", "?", "Be", "brief."]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]")
    wrapped.chat_template = template
    return wrapped


ITEM = PromptItem(uid="u1", task="t", question="What is 2 + 2 ?", answer="4")


def test_format_prompt_variants() -> None:
    cfg = DataConfig(instruction="Be brief.")
    chat = tiny_tokenizer(TEMPLATE)
    assert format_prompt(ITEM, chat, cfg) == "<|user|> What is 2 + 2 ?\nBe brief.\n<|assistant|>"
    sys_cfg = DataConfig(instruction="Be brief.", system_prompt="Be")
    assert format_prompt(ITEM, chat, sys_cfg) == "<|system|> Be\n<|user|> What is 2 + 2 ?\nBe brief.\n<|assistant|>"
    merged = format_prompt(ITEM, tiny_tokenizer(NO_SYSTEM), sys_cfg)
    assert merged == "<|user|> Be\n\nWhat is 2 + 2 ?\nBe brief.\n<|assistant|>"
    assert format_prompt(ITEM, tiny_tokenizer(None), cfg) == "What is 2 + 2 ?\nBe brief."
    # no chat template: the system prompt (which may ask for the answer format) is kept in front, not dropped
    assert format_prompt(ITEM, tiny_tokenizer(None), sys_cfg) == "Be\n\nWhat is 2 + 2 ?\nBe brief."
    assert format_prompt(ITEM, chat, DataConfig(instruction="Be brief.", system_prompt="Be", use_chat_template=False)
                         ) == "What is 2 + 2 ?\nBe brief."  # plain prompts asked for: as documented, without it
    plain_cfg = DataConfig(instruction="Be brief.", use_chat_template=False)
    assert format_prompt(ITEM, chat, plain_cfg) == "What is 2 + 2 ?\nBe brief."


def test_encode_prompts_drops_long_prompts() -> None:
    long_item = PromptItem(uid="u2", task="t", question="What is 2 + 2 + 2 + 2 + 2 ?", answer="10")
    cfg = DataConfig(instruction="Be brief.", max_prompt_length=10)
    ids, dropped = encode_prompts([long_item, ITEM], tiny_tokenizer(TEMPLATE), cfg)
    assert len(ids) == 2 and len(ids[0]) == 16  # aligned with the items, dropped ones included
    assert ids[1] == [1, 4, 5, 6, 7, 6, 8, 9, 10, 3]
    assert dropped == ["u2"]
    ids, dropped = encode_prompts([ITEM], tiny_tokenizer(None), cfg)
    assert ids == [[4, 5, 6, 7, 6, 8, 9, 10]] and dropped == []


def test_the_default_mixtures_gold_answers_are_the_true_results() -> None:
    """Each default task's gold answer, computed again from its question. reasoning-gym 0.1.25's
    basic_arithmetic with allow_parentheses=false rewrote divisions after writing the question
    ("Calculate 4 / 1." -> 2), so the default leaves division out."""
    import math
    import re

    from rollwise.config import load_config

    cfg = load_config().data
    train, evals = build_items(cfg.model_copy(update={"train_size": 1000, "eval_size": 100}), seed=0)
    checked = Counter()
    for it in train + evals:
        q = it.question
        nums = [int(x) for x in re.findall(r"-?\d+", q)]
        if it.task == "basic_arithmetic":
            expr = q.replace("Calculate", "").strip().rstrip(".")
            assert re.fullmatch(r"[\d\s+\-*]+", expr), q  # no division
            truth = eval(expr)  # noqa: S307  (digits and + - * only, checked above)
        elif it.task == "chain_sum":
            truth = eval(re.search(r"([\d\s+\-]+)=", q).group(1))  # noqa: S307
        elif it.task == "products":
            truth = eval(re.search(r"multiplication: ([\d\s*\-]+)\.", q).group(1))  # noqa: S307
        elif it.task == "gcd":
            truth = math.gcd(*nums)
        else:
            truth = math.lcm(*nums)
        assert str(truth) == it.answer, (it.task, q, it.answer)
        checked[it.task] += 1
    assert set(checked) == {"chain_sum", "products", "basic_arithmetic", "gcd", "lcm"} and min(checked.values()) > 100


def test_basic_arithmetic_items_whose_gold_answer_is_wrong_are_left_out(caplog) -> None:
    """reasoning-gym 0.1.25 ignores operator precedence without parentheses ("985 + 384 * 129" ->
    176601) and rounds divisions: those items are left out with a warning, the rest kept, and the
    task still gets its share of items."""
    from fractions import Fraction

    from rollwise.data.tasks import arithmetic_truth, wrong_gold

    def ba(question: str, answer: str, expression: str | None = None) -> PromptItem:
        entry = {"metadata": {"expression": expression}} if expression else {}
        return PromptItem("u", "basic_arithmetic", question, answer, entry)

    assert arithmetic_truth(ba("Calculate 985 + 384 * 129.", "0")) == 50521
    assert arithmetic_truth(ba("Calculate -1 / -( -( -( -2 - 9 ) ) + -3 + -13 ).", "0")) == Fraction(-1, 27)
    assert arithmetic_truth(ba("What is 50 + 83 * 6 + 9?", "0", "50 + 83 * 6 + 9")) == 557  # natural wording
    assert arithmetic_truth(ba("What is 50 + 83 * 6 + 9?", "0")) is None  # no metadata: not found
    assert arithmetic_truth(PromptItem("u", "chain_sum", "Calculate 1 + 2.", "3")) is None
    assert wrong_gold(ba("Calculate 985 + 384 * 129.", "176601"))
    assert not wrong_gold(ba("Calculate 985 + 384 * 129.", "50521"))
    assert wrong_gold(ba("Solve 50 + 83 * 6 + 9.", "807", "50 + 83 * 6 + 9"))
    assert wrong_gold(ba("Calculate 3 / ( 2 - 2 ).", "0"))  # no value at all
    assert not wrong_gold(ba("Calculate 3 \u00d7 2.", "6"))  # an expression it cannot read is kept
    assert not wrong_gold(PromptItem("u", "chain_sum", "Calculate 1 + 2.", "4"))  # other tasks are not checked here

    for style in ("simple", "natural"):
        spec = TaskSpec(name="basic_arithmetic", params={"min_terms": 3, "max_terms": 4, "allow_parentheses": False,
                                                         "operators": ["+", "-", "*"], "format_style": style})
        caplog.clear()
        with caplog.at_level("WARNING"):
            train, evals = build_items(DataConfig(tasks=[spec], train_size=200, eval_size=50), seed=0)
        assert len(train) == 200 and len(evals) == 50
        assert all(Fraction(it.answer) == arithmetic_truth(it) for it in train + evals), style
        said = [r.getMessage() for r in caplog.records if "left out" in r.getMessage()]
        assert len(said) == 2 and "operator precedence" in said[0]
        left_out = [int(m.split(": ")[1].split(" of ")[0]) for m in said]  # held-out, then training
        assert left_out[0] >= 5 and left_out[1] >= 40, style  # about a third of these items are wrong


def test_a_task_with_mostly_wrong_gold_answers_still_gets_its_items(caplog) -> None:
    """5-6 terms without parentheses: about 9 in 10 items are wrong. The stream is read further, so
    the task keeps its share (2n + 200 candidates alone gave 248 of 1000)."""
    spec = TaskSpec(name="basic_arithmetic", params={"min_terms": 5, "max_terms": 6, "allow_parentheses": False})
    with caplog.at_level("WARNING"):
        train, evals = build_items(DataConfig(tasks=[spec], train_size=1000, eval_size=20), seed=0)
    assert len(train) == 1000 and len(evals) == 20
    assert not [r for r in caplog.records if "only" in r.getMessage()]


def test_repeated_training_questions_are_named_per_task() -> None:
    from rollwise.data.tasks import repeated_questions_note
    from rollwise.types import PromptItem

    def items(task: str, questions: list[str]) -> list[PromptItem]:
        return [PromptItem(f"{task}:train:{i}", task, q, "1", {}) for i, q in enumerate(questions)]

    few = items("lcm", ["a", "a", "a", "b", "c"])  # 3 distinct of 5: below 0.8
    many = items("gcd", ["a", "b", "c", "d", "d"])  # 4 of 5: kept quiet
    note = repeated_questions_note(few + many)
    assert note is not None and "lcm 3 of 5" in note and "gcd" not in note
    assert repeated_questions_note(many) is None
