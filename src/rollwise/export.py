"""`rollwise export`: a run's checkpoint as a Hugging Face model folder.

A checkpoint holds only the trainable weights and the loop's state; the exported folder is
the full model (LoRA merged into the base weights), its tokenizer and generation config, in
the standard Hugging Face layout that `from_pretrained` and `model.name_or_path` load (tested;
other tools that read that layout, vLLM among them, were not tried here), plus
`rollwise_export.json` saying where it came from.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import stat
from pathlib import Path
from typing import Any

DTYPES = ("float32", "bfloat16", "float16")


def register(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "export", help="write a run's checkpoint as a Hugging Face model folder",
        description="Write the model of a run's last checkpoint (or of a given checkpoint folder) as a Hugging Face "
        "model folder: full weights (LoRA merged), tokenizer, generation config, and rollwise_export.json (the "
        "checkpoint, base model, LoRA merged or not, dtype). The folder loads with "
        "transformers' from_pretrained and as rollwise's model.name_or_path.")
    p.add_argument("target", metavar="RUN_DIR|CHECKPOINT", help="a run folder (its last checkpoint) or a checkpoint "
                   "folder (runs/<name>/checkpoints/step_N)")
    p.add_argument("out", metavar="OUT_DIR", help="the folder to write (must not exist or be empty)")
    p.add_argument("--dtype", choices=DTYPES, default="float32",
                   help="dtype of the written weights (default float32, the master weights)")
    p.set_defaults(func=run_export_command)
    return p


def _modes_of_umask(folder: Path, made: Path) -> None:
    """Give the written files the mode of `made`, a file this process created plainly (the umask's, ACLs included):
    safetensors writes the weights 0600, which left an exported model that another user or a server running under
    another account cannot read. (Read from a file, not by setting the umask: that is process-wide.)"""
    mode = stat.S_IMODE(made.stat().st_mode)
    for f in folder.iterdir():
        if f.is_file() and not f.is_symlink():
            os.chmod(f, mode)


def run_export_command(args: argparse.Namespace) -> int:
    import torch

    from rollwise.evalcmd import _target_config
    from rollwise.models import apply_lora, load_model, load_tokenizer, resolve_model_path, save_model_folder
    from rollwise.training.checkpoint import load_checkpoint_weights

    out = Path(args.out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(f"{out} exists and is not an empty folder; choose a new OUT_DIR")
    above = next((p for p in out.parents if p.exists()), None)
    if above is not None and not above.is_dir():
        raise FileExistsError(f"{above} is a file, so OUT_DIR {out} cannot be made under it; choose a new OUT_DIR")
    target = Path(args.target)
    if not target.exists():
        raise FileNotFoundError(f"'{args.target}' not found: give a run folder (runs/<name>) or a checkpoint folder")
    cfg, ckpt = _target_config(args.target, [], command="export")
    if ckpt is None:
        alone = (target / "weights.safetensors").is_file()
        raise FileNotFoundError(f"'{args.target}' is not a run or checkpoint folder (no config.yaml there or two "
                                "levels up)" + ("; a checkpoint folder reads its base model from its run's config.yaml "
                                                "(RUN/checkpoints/step_N): put it back under its run folder" if alone
                                                else "; a model folder needs no export"))
    path = resolve_model_path(cfg.model.name_or_path, cfg.model.cache_dir)
    # the model's own tokenizer: the pad token rollwise falls back to (its eos) is a choice of training's batches,
    # and a pad token equal to eos makes common fine-tuning collators mask every eos label of the exported model
    tok = load_tokenizer(path, pad=False)
    for key in ("local_files_only", "is_local"):  # how this process loaded it, not part of the tokenizer
        tok.init_kwargs.pop(key, None)
    model = load_model(path, torch.float32)
    if cfg.model.lora.enabled:
        model = apply_lora(model, cfg.model)
    load_checkpoint_weights(ckpt, model)
    if hasattr(model, "peft_config"):
        model = model.merge_and_unload()
    model = model.to(getattr(torch, args.dtype))
    # A new OUT_DIR is written beside it and renamed when complete; an existing empty one is written in place and
    # emptied again on failure. Either way a full disk leaves no half-written OUT_DIR to block a retry.
    existed = out.is_dir()
    tmp = out if existed else out.parent / f".{out.resolve().name}.tmp"
    if not existed:
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
    try:
        save_model_folder(model, tmp)
        tok.save_pretrained(str(tmp))
        (tmp / "rollwise_export.json").write_text(json.dumps({
            "checkpoint": str(ckpt.resolve()), "base_model": cfg.model.name_or_path,
            "lora_merged": cfg.model.lora.enabled, "dtype": args.dtype}, indent=1) + "\n")
        _modes_of_umask(tmp, tmp / "rollwise_export.json")
        if not existed:
            os.replace(tmp, out)
    except BaseException:
        if not existed:
            shutil.rmtree(tmp, ignore_errors=True)
        for leftover in list(tmp.iterdir()) if existed else []:  # the folder made beforehand stays, empty
            if leftover.is_dir() and not leftover.is_symlink():
                shutil.rmtree(leftover)
            else:
                leftover.unlink()
        raise
    print(f"exported {ckpt} -> {out} ({args.dtype}); use it as model.name_or_path={out}")
    return 0
