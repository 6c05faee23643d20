"""Reading a config: YAML files with unique keys, dotted command-line overrides, error messages that
name the key and what is allowed (TRL's names included), and the field descriptions `rollwise options` lists."""

from __future__ import annotations

import difflib
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Union, get_args, get_origin

import yaml
from pydantic import (
    BaseModel,
    ValidationError,
)

from rollwise.config.schema import Config, ConfigError


def _set_dotted(tree: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    node = tree
    for p in parts[:-1]:
        nxt = node.setdefault(p, {})
        if not isinstance(nxt, dict):
            raise ConfigError(f"config key '{key}': '{p}' is not a section")
        node = nxt
    node[parts[-1]] = value


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """Turn ['algo.beta=0.04', 'data.tasks=[...]'] into a nested dict (values parsed as YAML)."""
    tree: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise ConfigError(f"override '{item}' is not KEY=VALUE (for example algo.beta=0.04)")
        key, raw = item.split("=", 1)
        key = key.strip()
        if not key:
            raise ConfigError(f"override '{item}' has an empty key")
        parts = key.split(".")
        if "" in parts:
            raise ConfigError(f"override '{item}': the key '{key}' has an empty part (a dot too many); write "
                              "section.key=VALUE, for example algo.beta=0.04")
        listed = next((i for i, part in enumerate(parts) if part.isdigit() or "[" in part), None)
        if listed is not None:  # data.tasks.0.weight or data.tasks[0].weight
            whole = ".".join([*parts[:listed], parts[listed].split("[")[0]] if "[" in parts[listed] else parts[:listed])
            example = (" (for example data.tasks='[{name: basic_arithmetic, weight: 2}, {name: leg_counting}]')"
                       if whole == "data.tasks" else "")
            raise ConfigError(f"override '{item}': a list's items cannot be set one by one; give {whole} whole, as a "
                              f"YAML list{example}")
        text = _text_field(key)
        if text is not None and not _one_quoted_string(raw):
            # a text option keeps the text as typed: YAML would cut `#...` as a comment, read `a: b` as a
            # mapping and 2024-11-30 as a date; null (or ~) still means None where None is allowed
            _set_dotted(tree, key, None if text == "optional" and raw in ("null", "~") else raw)
            continue
        try:
            value = yaml.load(raw, Loader=_UniqueKeyLoader) if raw != "" else ""  # noqa: S506  (a SafeLoader)
        except yaml.YAMLError as e:
            raise ConfigError(f"override '{item}': value is not valid YAML ({e})") from None
        _set_dotted(tree, key, value)
    return tree


def _one_quoted_string(raw: str) -> bool:
    """Whether `raw` is one quoted YAML string ('a: b', "x"), not text that only starts and ends with a quote
    ("Answer" then "stop")."""
    if not (len(raw) > 1 and raw[0] == raw[-1] and raw[0] in "'\""):
        return False
    try:
        return isinstance(yaml.safe_load(raw), str)
    except yaml.YAMLError:
        return False


def _text_field(key: str) -> str | None:
    """"text" when the dotted `key` is a str option of Config, "optional" when str | None, else None."""
    *sections, name = key.split(".")
    field = getattr(_model_at(tuple(sections)), "model_fields", {}).get(name)
    if field is None:
        return None
    ann = field.annotation
    if ann is str:
        return "text"
    args = {get_args(a)[0] if get_origin(a) is Annotated else a for a in get_args(ann)}  # PathStr is a str
    return "optional" if get_origin(ann) in (Union, UnionType) and args == {str, type(None)} else None


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out


def _model_at(path: tuple[Any, ...]) -> Any:
    """The config section at `path` (names, list indices skipped), or None where there is none."""
    model: Any = Config
    for part in path:
        if isinstance(part, int):
            continue
        field = model.model_fields.get(part) if hasattr(model, "model_fields") else None
        if field is None:
            return None
        ann = field.annotation
        args = getattr(ann, "__args__", None)
        if args:
            ann = next((a for a in args if isinstance(a, type) and issubclass(a, BaseModel)), ann)
        model = ann
    return model


def _fields_at(loc: tuple[Any, ...]) -> list[str]:
    return list(getattr(_model_at(loc[:-1]), "model_fields", {}).keys())


# TRL's GRPOConfig names (and HF TrainingArguments') that rollwise spells otherwise: an unknown key that is one of
# them is pointed to its rollwise key, wherever it was given
TRL_NAMES = {
    **{k: f"train.{k}" for k in ("learning_rate", "max_steps", "warmup_steps", "max_grad_norm", "weight_decay",
                                 "gradient_checkpointing", "adam_beta1", "adam_beta2", "disable_dropout")},
    **{k: f"algo.{k}" for k in ("beta", "epsilon", "epsilon_high", "loss_type", "scale_rewards", "num_iterations",
                                "mask_truncated_completions")},
    **{k: f"rollout.{k}" for k in ("num_generations", "max_completion_length", "temperature", "top_p", "top_k")},
    "lr_scheduler_type": "train.lr_scheduler", "per_device_train_batch_size": "train.micro_batch_size (samples a "
    "forward/backward; a step trains rollout.prompts_per_step x num_generations)",
    "gradient_accumulation_steps": "train.micro_batch_size (a step is one batch of rollout.prompts_per_step x "
    "num_generations, split into micro-batches)", "max_prompt_length": "data.max_prompt_length",
    "save_steps": "run.save_every", "save_total_limit": "run.keep_checkpoints", "eval_steps": "eval.every_n_steps",
    "per_device_eval_batch_size": "eval.batch_size", "seed": "run.seed", "output_dir": "run.output_dir",
    "run_name": "run.name", "use_vllm": "rollout.engine=vllm", "importance_sampling_level": "algo.policy_loss=gspo "
    "(sequence-level ratios)", "reward_weights": "reward.functions' weight", "model_name_or_path": "model.name_or_path",
}


def _format_errors(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        loc = tuple(e["loc"])
        key = ".".join(str(p) for p in loc) or "(config)"
        if e["type"] == "extra_forbidden":
            known = _fields_at(loc)
            close = difflib.get_close_matches(str(loc[-1]), known, n=1)
            hint = f" Did you mean '{'.'.join(str(p) for p in loc[:-1] + (close[0],))}'?" if close else ""
            if str(loc[-1]) in TRL_NAMES:  # an exact TRL name: its key, not a look-alike here (save_steps != max_steps)
                hint = f" TRL's {loc[-1]} is {TRL_NAMES[str(loc[-1])]} here."
            lines.append(f"unknown config key '{key}'.{hint} Known keys here: {', '.join(known)}")
        elif e["type"] == "literal_error":
            allowed = e.get("ctx", {}).get("expected", "")
            lines.append(f"config key '{key}': got {e.get('input')!r}; allowed: {allowed}")
        else:
            msg = e["msg"].removeprefix("Value error, ")
            got = e.get("input")
            shown = "" if isinstance(got, (dict, list)) and len(repr(got)) > 80 else f" (got {got!r})"
            lines.append(msg if key == "(config)" else f"config key '{key}': {msg}{shown}")
    return "invalid config:\n  " + "\n  ".join(lines)


def build_config(data: dict[str, Any]) -> Config:
    try:
        return Config.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_format_errors(e)) from None


def read_run_config(run_dir: str | Path) -> dict[str, Any]:
    """A run folder's config.yaml as `rollwise train` wrote it; a ConfigError when it is empty or damaged."""
    path = Path(run_dir) / "config.yaml"
    try:
        saved = yaml.safe_load(path.read_text())
        why = "it is empty" if saved is None else None if isinstance(saved, dict) else "it holds no settings"
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        why = f"not valid YAML: {str(e).splitlines()[0]}"
    if why:
        raise ConfigError(f"{path} cannot be read ({why}), so the run's settings are unknown. Put back a copy of "
                          "that file, or start a new run")
    return saved


class _DuplicateKey(yaml.YAMLError):
    def __init__(self, key: Any, line: int, first: int) -> None:
        super().__init__(f"duplicate key {key!r}")
        self.key, self.line, self.first = key, line, first


class _UniqueKeyLoader(yaml.SafeLoader):
    """yaml.safe_load that refuses a key given twice in one mapping (a second `train:` section)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base`: keys given beside it override the base's
                continue
            key = self.construct_object(key_node, deep=deep)
            line = key_node.start_mark.line + 1
            try:
                hash(key)
            except TypeError:  # a list as a key: SafeLoader's own error ("found unhashable key") names it
                continue
            if key in seen:
                raise _DuplicateKey(key, line, seen[key])
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


def read_config_file(path: str | Path) -> dict[str, Any]:
    """A YAML config file's sections as a dict (not yet validated), or a ConfigError naming the file."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file '{p}' not found (looked for it from {Path.cwd()}); check the path")
    if p.suffix.lower() in (".jsonl", ".csv", ".parquet"):  # `rollwise train data.jsonl`: a data file, not a config
        raise ConfigError(f"'{p}' is a data file, not a config file (.yaml): train on it as a file task, "
                          f"data.tasks='[{{name: {p.stem}, path: {p}, prompt_column: ..., answer_column: ...}}]' "
                          "(or the same under data: tasks: in a CONFIG.yaml); `rollwise options` lists the keys")
    try:
        loaded = yaml.load(p.read_text(), Loader=_UniqueKeyLoader) or {}  # noqa: S506  (a SafeLoader)
    except _DuplicateKey as e:
        raise ConfigError(f"config file '{p}': '{e.key}' is given twice in one section (lines {e.first} and "
                          f"{e.line}); YAML keeps only the last and would drop the other's settings without a "
                          "word. Merge them into one") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"config file '{p}' is not valid YAML: {e}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"config file '{p}' is not UTF-8 text (a Windows shell's `>` writes UTF-16); save it as "
                          "UTF-8") from None
    if not isinstance(loaded, dict):
        raise ConfigError(f"config file '{p}' must hold a mapping of sections, got {type(loaded).__name__}")
    return _empty_sections(loaded)


def _empty_sections(tree: dict[str, Any], path: tuple[str, ...] = ()) -> dict[str, Any]:
    """`tree` with each section YAML read as null (`model:` with every key under it commented out) made empty."""
    out = dict(tree)
    fields = getattr(_model_at(path), "model_fields", {})
    for k, v in tree.items():
        sub = fields[k].annotation if k in fields else None  # a section, not a list of them (data.tasks)
        if not (isinstance(sub, type) and issubclass(sub, BaseModel)):
            continue
        if v is None:
            out[k] = {}
        elif isinstance(v, dict):
            out[k] = _empty_sections(v, (*path, k))
    return out


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Defaults, then the YAML file, then dotted overrides; validated as a whole."""
    data = read_config_file(path) if path is not None else {}
    if overrides:
        data = _merge(data, parse_overrides(overrides))
    return build_config(data)


def config_to_dict(cfg: Config) -> dict[str, Any]:
    return cfg.model_dump(mode="json")


def leaves(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{dotted key: value} of a nested mapping's leaves (a list is one leaf)."""
    out: dict[str, Any] = {}
    for k, v in tree.items():
        if isinstance(v, dict):
            out.update(leaves(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def config_changes(old: dict[str, Any], new: dict[str, Any]) -> tuple[dict[str, list[Any]], dict[str, Any]]:
    """({dotted key: [old value, new value]} for every setting of `old` that differs in `new`,
    {dotted key: value} for every setting `new` has and `old` lacks, such as one a newer rollwise added)."""
    a, b = leaves(old), leaves(new)
    return {k: [a[k], b.get(k)] for k in a if a[k] != b.get(k)}, {k: v for k, v in b.items() if k not in a}


def describe_fields(model: type[BaseModel] = Config, prefix: str = "") -> list[tuple[str, str, str]]:
    """(dotted key, default, description) for every leaf option: the options table of `rollwise options`; a list of
    sections (data.tasks, reward.functions) is followed by the keys of its items (`data.tasks[].path`)."""
    rows: list[tuple[str, str, str]] = []
    for name, field in model.model_fields.items():
        ann = field.annotation
        key = f"{prefix}{name}"
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            rows.extend(describe_fields(ann, key + "."))
            continue
        if field.is_required():  # a list item's own key, such as data.tasks[].name
            rows.append((key, "required", field.description or ""))
            continue
        default = field.get_default(call_default_factory=True)
        if isinstance(default, list) and default and isinstance(default[0], BaseModel):
            default = [d.model_dump(exclude_defaults=True) for d in default]
        rows.append((key, repr(default), field.description or ""))
        item = get_args(ann)[0] if get_origin(ann) is list and get_args(ann) else None
        if isinstance(item, type) and issubclass(item, BaseModel):  # the keys of each item: data.tasks[].path
            rows.extend(describe_fields(item, f"{key}[]."))
    return rows
