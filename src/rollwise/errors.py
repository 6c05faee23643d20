"""Errors a run can end with that are not about its config, model, checkpoint or storage (those live
beside the code that raises them: ConfigError, ModelError, CheckpointError, StorageError). The CLI
prints each as one `rollwise: error:` line."""


class RolloutWorkerError(RuntimeError):
    """A rollout worker died more often than Ray may restart it; the message says how to go on."""


class RewardWorkerError(RuntimeError):
    """The reward worker, which started before, could not be started again mid-run; the run resumes."""


class RunInUseError(RuntimeError):
    """Another process trains in the same run folder (its metrics and checkpoints would interleave)."""


class TrainingDivergedError(RuntimeError):
    """An update's gradient was not finite (nothing was applied); the message says what to lower."""
