"""The `rollwise` command: train, eval, report, options, export, simulate."""

from __future__ import annotations

import argparse
import errno
import os
import sys
from pathlib import Path

from rollwise import __version__

EXAMPLES = """examples:
  rollwise train                                   # SmolLM2-135M on the built-in arithmetic mixture
  rollwise train configs/default.yaml train.max_steps=40 algo.loss_type=grpo
  rollwise train --resume runs/20261130-101500 train.max_steps=60
  rollwise eval runs/20261130-101500               # score a run's last checkpoint
  rollwise report runs/20261130-101500             # plots + summary
  rollwise report runs/uniform runs/adaptive       # runs side by side: accuracy against rollout tokens
  rollwise export runs/20261130-101500 out/model   # the trained model as a Hugging Face folder
  rollwise options                                 # every config key, default and meaning
"""


def _split_args(items: list[str]) -> tuple[str | None, list[str]]:
    config, overrides = None, []
    for it in items:
        if "=" in it and not (it.endswith((".yaml", ".yml")) and Path(it).is_file()):  # runs/lr=1e-5/config.yaml
            overrides.append(it)
        elif config is None and (it.endswith((".yaml", ".yml")) or Path(it).is_file()):
            config = it
        elif config is not None and (it.endswith((".yaml", ".yml")) or Path(it).is_file()):
            raise UsageError(f"two config files ('{config}' and '{it}'): give one CONFIG.yaml and put the other's "
                             "settings in it or as KEY=VALUE overrides")
        elif Path(it).is_dir():  # `rollwise train runs/x` for --resume, `rollwise eval KEY=VALUE runs/x`
            raise UsageError(f"'{it}' is a folder, neither a config file (.yaml) nor a KEY=VALUE override: a run "
                             f"folder goes after --resume (`rollwise train --resume {it}`), or first "
                             f"(`rollwise eval {it} [KEY=VALUE ...]`, `rollwise export {it} OUT_DIR`)")
        else:
            raise UsageError(f"'{it}' is neither a config file (.yaml) nor a KEY=VALUE override")
    return config, overrides


class UsageError(Exception):
    """Arguments that do not fit together; main prints the message and exits with status 2."""


def cmd_train(args: argparse.Namespace) -> int:
    from rollwise.config import load_config, parse_overrides

    config, overrides = _split_args(args.items)
    if args.resume:
        from rollwise.loop import load_resumed_config

        if config:
            raise UsageError("--resume uses the run's saved config; pass only KEY=VALUE overrides")
        cfg = load_resumed_config(args.resume, parse_overrides(overrides))
    else:
        cfg = load_config(config, overrides)
    from rollwise.loop import train

    res = train(cfg, resume=args.resume)
    if res.eval_before or res.eval_after:
        b, a = res.eval_before.get("eval/accuracy"), res.eval_after.get("eval/accuracy")
        parts = [f"before {b:.3f}" if b is not None else "", f"after {a:.3f}" if a is not None else ""]
        print(f"held-out accuracy: {'  '.join(p for p in parts if p)}" + (f"  ({(a - b) * 100:+.1f} points)" if a is not None and b is not None else ""))
    print(f"run folder: {res.run_dir}")
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from rollwise.evalcmd import run_eval_command

    return run_eval_command(args)


def cmd_report(args: argparse.Namespace) -> int:
    from rollwise.report import plot_run
    from rollwise.ui import print_summary

    run_dirs = [Path(d) for d in args.run_dirs]
    output = _figure_path(args.output) if args.output else None
    if len(run_dirs) > 1:
        from rollwise.compare import report_runs

        report_runs(run_dirs, output or Path("compare.png"))
        return 0
    png = plot_run(run_dirs[0], output)
    print_summary(run_dirs[0])
    print(f"plots: {png}")
    return 0


def _figure_path(output: str) -> Path:
    """-o FILE as matplotlib will write it: .png added when it has no suffix; a format it cannot write is
    a ConfigError before anything is drawn."""
    from matplotlib.figure import Figure

    from rollwise.config import ConfigError

    path = Path(output)
    if not path.suffix:
        return path.with_suffix(".png")
    kinds = Figure().canvas.get_supported_filetypes()
    if path.suffix[1:].lower() not in kinds:
        raise ConfigError(f"-o {output}: matplotlib cannot write '{path.suffix}' files; use one of "
                          f"{', '.join('.' + k for k in sorted(kinds))} (for example -o report.png)")
    return path


def cmd_options(args: argparse.Namespace) -> int:
    from rollwise.config import describe_fields

    rows = describe_fields()
    if args.markdown:
        print("| key | default | meaning |\n|---|---|---|")
        for k, d, desc in rows:
            print(f"| `{k}` | `{d}` | {desc} |")
    else:
        w = max(len(k) for k, _, _ in rows)
        for k, d, desc in rows:
            print(f"{k:<{w}}  {desc}  [default: {d}]")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rollwise", description="RL post-training of LLMs with verifiable rewards.",
                                epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"rollwise {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    t = sub.add_parser("train", help="train a model with RL (defaults: SmolLM2-135M, arithmetic mixture)",
                       description="Train. Arguments: an optional CONFIG.yaml, then KEY=VALUE overrides "
                       "(see `rollwise options`).")
    t.add_argument("items", nargs="*", metavar="[CONFIG.yaml] [KEY=VALUE ...]")
    t.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from its last checkpoint; KEY=VALUE overrides (a larger "
                   "train.max_steps, a smaller train.micro_batch_size) change its settings, each change said and kept "
                   "in RUN_DIR/environment.json; data.*, run.seed, model.name_or_path, model.lora.enabled/r/alpha/target_modules, "
                   "planner.strategy, run.name and run.output_dir cannot change, nor can the loop (distributed.async_training, "
                   "distributed.backend)")
    t.set_defaults(func=cmd_train)

    e = sub.add_parser("eval", help="score a model, run folder or checkpoint on held-out tasks",
                       description="Greedy accuracy (and pass@k with eval.pass_k=K) on the config's held-out split.")
    e.add_argument("target", nargs="?", help="run folder, checkpoint folder, or model (default: model.name_or_path)")
    e.add_argument("items", nargs="*", metavar="[CONFIG.yaml] [KEY=VALUE ...]")
    e.set_defaults(func=cmd_eval)

    r = sub.add_parser("report", help="plot a run (PNG) and print its summary, or compare runs",
                       description="One run: draw its metrics into RUN_DIR/report.png and print its summary table. "
                       "Several runs: print the settings that differ between them and a table of held-out accuracy "
                       "against rollout tokens, the first run the baseline (its share of the first run's tokens, and the "
                       "tokens each run needed to reach the first run's final accuracy), and draw the curves into "
                       "compare.png.")
    r.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="a run folder (runs/<name>) with a metrics.jsonl")
    r.add_argument("-o", "--output", metavar="PNG", help="where to draw the plots, any format matplotlib writes "
                   "(.png added when there is no suffix; default: RUN_DIR/report.png for one run, ./compare.png for several)")
    r.set_defaults(func=cmd_report)

    o = sub.add_parser("options", help="list every config key with its default and meaning")
    o.add_argument("--markdown", action="store_true", help="print a Markdown table")
    o.set_defaults(func=cmd_options)
    from rollwise.export import register as register_export
    from rollwise.sim.command import register

    register_export(sub)
    register(sub)
    return p


def out_of_memory(e: BaseException) -> bool:
    """Python's MemoryError, torch's OutOfMemoryError (GPU), or the RuntimeError torch's CPU allocator raises."""
    if isinstance(e, MemoryError) or type(e).__name__ == "OutOfMemoryError":
        return True
    text = str(e).lower()
    return isinstance(e, RuntimeError) and ("can't allocate memory" in text or "out of memory" in text)


def memory_hint(command: str | None) -> str:
    """What to lower after running out of memory, for the command that ran."""
    if command == "eval":
        return ("Lower eval.batch_size (sequences evaluated together) or eval.max_completion_length, or evaluate "
                "fewer items (data.eval_size).")
    if command == "export":  # nothing of training's to lower: the whole model is held in float32
        return ("Export holds the whole model in float32 (with LoRA, merged into the base) whatever --dtype writes: "
                "free memory used by other processes, or export on a machine with more.")
    if command == "simulate":
        return "Run fewer processes at once (--workers), or lower --pool or --seeds."
    return ("Lower train.micro_batch_size (sequences per forward/backward), rollout.batch_size or rollout.num_slots "
            "(sequences generated together) or rollout.max_completion_length, or train LoRA adapters "
            "(model.lora.enabled=true). A run continues from its last checkpoint with `rollwise train --resume "
            "RUN_DIR KEY=VALUE`, e.g. train.micro_batch_size=4.")


def disk_hint(command: str | None) -> str:
    """What to do about a full disk, for the command that ran."""
    if command == "train":
        return ("free disk space, or start a new run with run.output_dir (or model.cache_dir, where the built-in model "
                "is converted once) on another disk. A run continues from its last checkpoint with `rollwise train "
                "--resume RUN_DIR`; to continue it on another disk, copy its folder there and resume the copy.")
    if command == "export":
        return "free disk space or give an OUT_DIR on another disk, then export again."
    return "free disk space (or set model.cache_dir on another disk), then run the command again."


def write_hint(command: str | None) -> str:
    """Where to write instead, when a folder cannot be written, for the command that ran."""
    if command == "train":
        return "where it is an output, set run.output_dir (or model.cache_dir) to a folder you can write."
    if command == "export":
        return "where it is the output, give an OUT_DIR you can write."
    if command == "report":
        return "where it is the plot, give -o PATH where you can write."
    if command == "simulate":
        return "where it is the output, give --out DIR where you can write."
    return "where it is the converted model's cache, set model.cache_dir to a folder you can write."


def interrupt_hint() -> str:
    """What to do after Ctrl-C stopped `rollwise train`: the command that continues this run."""
    from rollwise import ui
    from rollwise.training.checkpoint import latest_checkpoint

    run_dir = ui.active_run_dir
    if run_dir is None:  # stopped before the run folder was made
        return ""
    if latest_checkpoint(run_dir) is None:
        return f"; {run_dir} has no checkpoint yet: start it again with {ui.start_again_command(run_dir)}"
    return f"; continue from its last checkpoint with `rollwise train --resume {run_dir}`"


def name_run_dir(message: str) -> str:
    """A `rollwise train` error's `--resume RUN_DIR` with the folder of the run that stopped; where that run has
    no checkpoint yet (nothing to resume: --resume would refuse it), also the command that starts it again."""
    from rollwise import ui
    from rollwise.training.checkpoint import latest_checkpoint

    run_dir = ui.active_run_dir
    if run_dir is None or "--resume RUN_DIR" not in message:
        return message
    if latest_checkpoint(run_dir) is None:
        return (f"{message.rstrip('.')}; {run_dir} has no checkpoint yet, so there is nothing to resume: start it "
                f"again with {ui.start_again_command(run_dir)}")
    return message.replace("--resume RUN_DIR", f"--resume {run_dir}")


def stdout_reader_gone() -> bool:
    """Whether stdout is a pipe whose reader has closed it (`| head` that has read its lines): the
    system reports an error condition on its write end."""
    import select

    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), 0)  # no events asked: POLLERR and POLLHUP come regardless
        return any(ev & (select.POLLERR | select.POLLHUP) for _, ev in poller.poll(0))
    except (AttributeError, OSError, ValueError):  # no poll (Windows), or stdout is no file (captured)
        return False


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:  # Ctrl-C while the imports below load torch (seconds) is said like one during the command
        parser = build_parser()
        args, extra = parser.parse_known_args(argv)
        if extra and isinstance(getattr(args, "items", None), list) and not any(x.startswith("-") for x in extra):
            args.items += extra  # KEY=VALUE on both sides of an option: `rollwise train A=1 --resume RUN B=2`
        elif extra:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        from rollwise import ui

        ui.active_run_dir = None  # set by `rollwise train` once its run folder is made
        if not getattr(args, "func", None):
            parser.print_help()
            return 0
        from rollwise.config import ConfigError
        from rollwise.errors import RewardWorkerError, RolloutWorkerError, RunInUseError, TrainingDivergedError
        from rollwise.models import ModelError
        from rollwise.tracking import StorageError
        from rollwise.training.checkpoint import CheckpointError
    except KeyboardInterrupt:
        print("rollwise: interrupted", file=sys.stderr)
        return 130

    try:
        return int(args.func(args) or 0)
    except (ConfigError, ModelError, CheckpointError, StorageError, FileNotFoundError, FileExistsError,
            UsageError, RolloutWorkerError, RewardWorkerError, RunInUseError, TrainingDivergedError) as e:
        print(f"rollwise: error: {name_run_dir(str(e)) if args.command == 'train' else e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        hint = interrupt_hint() if args.command == "train" else ""
        print(f"rollwise: interrupted{hint}", file=sys.stderr)
        return 130
    except (MemoryError, RuntimeError) as e:
        if not out_of_memory(e):
            raise
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        hint = memory_hint(args.command)
        print(f"rollwise: error: out of memory ({first}). {name_run_dir(hint) if args.command == 'train' else hint}",
              file=sys.stderr)
        return 2
    except BrokenPipeError:
        if not stdout_reader_gone():
            raise
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the exit's own flush says nothing
        return 141  # as a tool killed by SIGPIPE (`rollwise options | head`)
    except OSError as e:
        where = f" writing {e.filename}" if e.filename else ""
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            hint = disk_hint(args.command)
            print(f"rollwise: error: disk full{where} ({e.strerror}); "
                  f"{name_run_dir(hint) if args.command == 'train' else hint}", file=sys.stderr)
            return 2
        if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            target = f" for {e.filename}" if e.filename else ""
            print(f"rollwise: error: permission denied{target} ({e.strerror}); make it readable (or writable, for "
                  f"an output) by you, or {write_hint(args.command)}", file=sys.stderr)
            return 2
        if e.errno == errno.ENOTDIR:
            print(f"rollwise: error: {e.filename}: a part of this path is a file, not a folder; "
                  f"{write_hint(args.command)}", file=sys.stderr)
            return 2
        if e.errno == errno.EISDIR:  # `rollwise report RUN -o plots.png` where plots.png is a folder
            print(f"rollwise: error: {e.filename} is a folder, not a file; {write_hint(args.command)}", file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":
    sys.exit(main())
