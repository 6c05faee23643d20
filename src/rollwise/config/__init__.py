"""One typed config for every command: YAML file + dotted command-line overrides.

Every field carries a one-line description; `rollwise options` prints them.
Unknown keys, wrong types and impossible values fail here, before any model is loaded,
with a message that names the key and what is allowed.

- schema.py: the sections, their fields and the checks across sections
- unused.py: options a config sets but does not use (warned before a run starts)
- files.py:  YAML files, dotted overrides, error messages, field descriptions
"""

from rollwise.config.files import (
    TRL_NAMES,
    build_config,
    config_changes,
    config_to_dict,
    describe_fields,
    leaves,
    load_config,
    parse_overrides,
    read_config_file,
    read_run_config,
)
from rollwise.config.files import _merge as _merge
from rollwise.config.schema import (
    DEFAULT_INSTRUCTION,
    DEFAULT_TASKS,
    AlgoConfig,
    Config,
    ConfigError,
    DataConfig,
    DistributedConfig,
    EvalConfig,
    LoraConfig,
    ModelConfig,
    PathStr,
    PlannerConfig,
    RewardConfig,
    RewardSpec,
    RolloutConfig,
    RunConfig,
    TaskSpec,
    TrainConfig,
)
from rollwise.config.unused import _planner_draws as _planner_draws
from rollwise.config.unused import unused_settings

__all__ = [
    "DEFAULT_INSTRUCTION", "DEFAULT_TASKS", "TRL_NAMES", "AlgoConfig", "Config", "ConfigError", "DataConfig",
    "DistributedConfig", "EvalConfig", "LoraConfig", "ModelConfig", "PathStr", "PlannerConfig", "RewardConfig",
    "RewardSpec", "RolloutConfig", "RunConfig", "TaskSpec", "TrainConfig", "build_config", "config_changes",
    "config_to_dict", "describe_fields", "leaves", "load_config", "parse_overrides", "read_config_file",
    "read_run_config", "unused_settings",
]
