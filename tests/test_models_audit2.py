"""Loading users' model folders, `rollwise export` and `rollwise eval` on varied tiny models: untied lm_head, no pad
token, no chat template, an eos list in generation_config, GPT-2's learned positions and Conv1D layers, Qwen2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rollwise.cli import main
from rollwise.models import ModelError, load_model, load_tokenizer, resolve_model_path

TESTS = Path(__file__).parent


@pytest.fixture(autouse=True)
def _tests_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(TESTS))


def build_variant(folder: Path, arch: str = "llama", tied: bool = True, pad: bool = True, chat: bool = True,
                  gen_eos: list[int] | None = None, seed: int = 0) -> Path:
    """A character-level tokenizer and a 2-layer model of `arch` (llama, gpt2, qwen2) saved as an HF folder."""
    from conftest import CHAT_TEMPLATE
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import GenerationConfig, PreTrainedTokenizerFast

    specials = ["<pad>", "<|im_end|>", "<|im_start|>", "<unk>"]
    vocab = {t: i for i, t in enumerate(specials + [chr(i) for i in range(32, 127)] + ["\n"])}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tk.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<|im_end|>", unk_token="<unk>",
                                  additional_special_tokens=["<|im_start|>"], **({"pad_token": "<pad>"} if pad else {}))
    if chat:
        tok.chat_template = CHAT_TEMPLATE
    torch.manual_seed(seed)
    ids = {"pad_token_id": 0 if pad else None, "eos_token_id": 1, "bos_token_id": 2}
    if arch == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        model = GPT2LMHeadModel(GPT2Config(vocab_size=len(vocab), n_embd=64, n_layer=2, n_head=4, n_positions=512,
                                           tie_word_embeddings=tied, **ids))
    elif arch == "qwen2":
        from transformers import Qwen2Config, Qwen2ForCausalLM

        model = Qwen2ForCausalLM(Qwen2Config(vocab_size=len(vocab), hidden_size=64, intermediate_size=128,
                                             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                             max_position_embeddings=512, tie_word_embeddings=tied, **ids))
    else:
        from transformers import LlamaConfig, LlamaForCausalLM

        model = LlamaForCausalLM(LlamaConfig(vocab_size=len(vocab), hidden_size=64, intermediate_size=128,
                                             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                             max_position_embeddings=512, tie_word_embeddings=tied, **ids))
    if not tied:  # a head that is really its own weight
        with torch.no_grad():
            model.lm_head.weight.normal_(0, 0.2)
    if gen_eos is not None:
        model.generation_config = GenerationConfig(eos_token_id=gen_eos, bos_token_id=2, pad_token_id=ids["pad_token_id"])
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def _train(model_dir: Path, runs: Path, name: str, extra: list[str] = ()) -> Path:
    from test_e2e import _args

    assert main(["train", *_args(model_dir, runs, name, 2, ["eval.at_start=false", "eval.at_end=false", *extra])]) == 0
    return runs / name


PROMPTS = ["1 + 2 =", "What is 7 + 5?", "hello"]


def _engine_greedy(target: Path, n: int = 12) -> list[list[int]]:
    """Greedy tokens of `rollwise eval`'s engine on the checkpoint `target` points to, float32."""
    from rollwise.engine.hf import GenerationRequest
    from rollwise.evalcmd import _target_config, eval_engine

    cfg, ckpt = _target_config(str(target), ["model.dtype=float32"])
    path = resolve_model_path(cfg.model.name_or_path)
    tok = load_tokenizer(path)
    engine = eval_engine(cfg, path, ckpt, tok)
    reqs = [GenerationRequest(tok(p)["input_ids"], n, greedy=True) for p in PROMPTS]
    return [o.response_ids for o in engine.generate(reqs)]


def _hf_greedy(folder: Path, n: int = 12) -> list[list[int]]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(folder))
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    out = []
    for p in PROMPTS:
        ids = torch.tensor([tok(p)["input_ids"]])
        gen = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
                             pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else 1)
        out.append(gen[0, ids.shape[1]:].tolist())
    return out


def _cut(ids: list[int], eos: set[int]) -> list[int]:
    for i, t in enumerate(ids):
        if t in eos:
            return ids[: i + 1]
    return ids


# ---------------------------------------------------------------------------------------------------- loading


def test_loading_errors_name_what_is_wrong_and_what_to_do(tmp_path):
    with pytest.raises(ModelError, match="not found: expected a folder with config.json"):
        resolve_model_path(str(tmp_path / "nope"))
    # a file (config.json itself, a weights file) was "not found", which it plainly is
    (tmp_path / "file.bin").write_text("x")
    with pytest.raises(ModelError, match=r"'.*file.bin' is a file, not a folder: give the Hugging Face model folder"):
        resolve_model_path(str(tmp_path / "file.bin"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelError, match="has no config.json: not a Hugging Face model folder"):
        resolve_model_path(str(tmp_path / "empty"))
    folder = build_variant(tmp_path / "m")
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"):
        (folder / f).unlink(missing_ok=True)
    assert resolve_model_path(str(folder)) == str(folder)
    with pytest.raises(ModelError, match="has no tokenizer: none of tokenizer.json.*copy the tokenizer files"):
        load_tokenizer(str(folder))


def test_a_tokenizer_without_pad_pads_with_its_eos(tmp_path):
    folder = build_variant(tmp_path / "m", pad=False)
    tok = load_tokenizer(str(folder))
    assert tok.pad_token == tok.eos_token == "<|im_end|>"


@pytest.mark.parametrize("name, dtype", [("float32", torch.float32), ("bfloat16", torch.bfloat16),
                                         ("float16", torch.float16)])
def test_model_dtype_sets_the_engine_dtype_with_fp32_master_weights(name, dtype):
    from rollwise.config import load_config
    from rollwise.engine.factory import engine_dtype
    from rollwise.models import compute_dtype, native_bf16

    cfg = load_config(None, [f"model.dtype={name}"])
    assert engine_dtype(cfg) == dtype
    assert compute_dtype("auto") == (torch.bfloat16 if native_bf16("cpu") else torch.float32)


# ---------------------------------------------------------------------------------------------------- export


VARIANTS = {
    "llama-untied-nopad-nochat": dict(arch="llama", tied=False, pad=False, chat=False),
    "qwen2-eos-list": dict(arch="qwen2", tied=False, gen_eos=[1, 0]),
    "gpt2": dict(arch="gpt2", tied=True, pad=False),
}
LORA_TARGETS = {"llama": "[q_proj, v_proj, lm_head]", "qwen2": "[q_proj, v_proj, down_proj]", "gpt2": "[c_attn, c_fc]"}


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_export_is_the_checkpoint_and_generates_as_the_engine_does(tmp_path, variant, lora):
    from transformers import AutoModelForCausalLM

    spec = VARIANTS[variant]
    base = build_variant(tmp_path / "base", **spec)
    if spec["arch"] == "llama" and lora:  # lm_head is untied here, so adapting it is allowed
        extra = [f"model.lora.target_modules={LORA_TARGETS['llama']}"]
    else:
        extra = [f"model.lora.target_modules={LORA_TARGETS[spec['arch']]}"] if lora else []
    extra += ["model.lora.enabled=true", "model.lora.r=4", "train.learning_rate=0.05"] if lora else []
    run = _train(base, tmp_path / "runs", "r", extra)
    out = tmp_path / "exported"
    assert main(["export", str(run), str(out)]) == 0
    ckpt = run / "checkpoints" / "step_000002"
    hf = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).state_dict()
    base_sd = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32).state_dict()
    assert hf.keys() == base_sd.keys()
    if not lora:  # the checkpoint's weights, bit for bit
        ck = load_file(str(ckpt / "weights.safetensors"))
        assert ck and all(torch.equal(hf[k], v) for k, v in ck.items())
    else:  # the merged weights the engine runs
        from rollwise.evalcmd import _target_config, eval_engine

        cfg, c = _target_config(str(run), [])
        engine = eval_engine(cfg, str(base), c, load_tokenizer(str(base)))
        esd = engine.model.state_dict()
        moved = [k for k in hf if not torch.equal(hf[k], base_sd[k])]
        assert moved, "LoRA's training left no trace in the exported weights"
        for k in hf:
            assert torch.allclose(hf[k], esd[k].float(), atol=1e-6), k
    # generation config and tokenizer carried over
    src_gen = json.loads((base / "generation_config.json").read_text())
    got_gen = json.loads((out / "generation_config.json").read_text())
    assert got_gen["eos_token_id"] == src_gen["eos_token_id"]
    src_tok = json.loads((base / "tokenizer_config.json").read_text())
    got_tok = json.loads((out / "tokenizer_config.json").read_text())
    # (transformers may name a model-specific tokenizer class: Qwen2Tokenizer for a qwen2 config)
    same = {k: v for k, v in got_tok.items() if k in src_tok and k != "tokenizer_class"}
    assert same == {k: v for k, v in src_tok.items() if k != "tokenizer_class"}, "not the model's own tokenizer"
    assert got_tok.get("pad_token") == src_tok.get("pad_token")  # rollwise's eos fallback is not written into it
    assert not {"local_files_only", "is_local"} & set(got_tok)  # how rollwise loaded it, not part of it
    from transformers import AutoTokenizer

    a, b = AutoTokenizer.from_pretrained(str(base)), AutoTokenizer.from_pretrained(str(out))
    assert [a(p)["input_ids"] for p in PROMPTS] == [b(p)["input_ids"] for p in PROMPTS]
    assert (a.chat_template, a.eos_token, a.pad_token) == (b.chat_template, b.eos_token, b.pad_token)
    # greedy generation in float32: transformers on the export equals rollwise's engine on the checkpoint
    eos = set(src_gen["eos_token_id"] if isinstance(src_gen["eos_token_id"], list) else [src_gen["eos_token_id"]]) | {1}
    assert [_cut(x, eos) for x in _hf_greedy(out)] == [_cut(x, eos) for x in _engine_greedy(run)]


def test_a_pad_token_equal_to_eos_still_trains_the_eos_of_a_response():
    """With no pad token rollwise pads with eos: the response mask comes from lengths, not from `ids != pad`, so the
    eos that ends a response is trained, not masked as padding."""
    from rollwise.training.logprobs import pack, pack_shared

    eos = 1
    b = pack([[5, 6], [7]], [[8, eos], [9, 9, eos]], pad_id=eos)
    assert b.response_mask.tolist() == [[1, 1, 0], [1, 1, 1]]
    s = pack_shared([[5, 6], [5, 6]], [[8, eos], [eos]], pad_id=eos)
    assert s.response_mask.tolist() == [[1, 1], [1, 0]]


# ---------------------------------------------------------------------------------------------------- eval


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_eval_and_export_read_the_checkpoint_named_not_the_base_model(tmp_path, lora):
    """A run folder is its last checkpoint, a checkpoint folder that one, a model folder its own weights; LoRA merged."""
    from transformers import AutoModelForCausalLM

    from rollwise.evalcmd import _target_config, eval_engine
    from rollwise.models import apply_lora, merged_state_dict
    from rollwise.training.checkpoint import load_checkpoint_weights

    base = build_variant(tmp_path / "base", tied=False)
    extra = ["run.save_every=1", "train.learning_rate=0.05"]
    extra += ["model.lora.enabled=true", "model.lora.r=4"] if lora else []
    run = _train(base, tmp_path / "runs", "r", extra)
    tok = load_tokenizer(str(base))
    plain = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32).state_dict()

    def expected(ckpt: Path) -> dict[str, torch.Tensor]:
        cfg, _ = _target_config(str(run), [])
        model = load_model(str(base))
        if lora:
            model = apply_lora(model, cfg.model)
        load_checkpoint_weights(ckpt, model)
        return merged_state_dict(model)

    step1, step2 = (run / "checkpoints" / f"step_00000{i}" for i in (1, 2))
    for target, ckpt in ((run, step2), (step1, step1), (step2, step2)):
        cfg, got = _target_config(str(target), ["model.dtype=float32"])
        assert got == ckpt
        sd = eval_engine(cfg, str(base), got, tok).model.state_dict()
        want = expected(ckpt)
        assert all(torch.allclose(sd[k].float(), want[k], atol=1e-6) for k in plain), target
        assert any(not torch.equal(sd[k].float(), plain[k]) for k in plain), "the base model's weights"
        out = tmp_path / f"export-{ckpt.name}-{target.name}"
        assert main(["export", str(target), str(out)]) == 0
        hf = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).state_dict()
        assert all(torch.allclose(hf[k], want[k], atol=1e-6) for k in plain)
    # the two checkpoints differ, so the comparisons above tell them apart
    assert any(not torch.equal(expected(step1)[k], expected(step2)[k]) for k in plain)
    cfg, got = _target_config(str(base), ["model.dtype=float32"])
    assert got is None
    sd = eval_engine(cfg, str(base), None, tok).model.state_dict()
    assert all(torch.equal(sd[k].float(), plain[k]) for k in plain)


def test_export_refuses_a_non_empty_folder_and_a_file_and_keeps_them(tiny_model_dir, tmp_path, capsys):
    run = _train(tiny_model_dir, tmp_path / "runs", "r")
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "keep.txt").write_text("mine")
    (tmp_path / "afile").write_text("mine")
    assert main(["export", str(run), str(busy)]) == 2
    assert main(["export", str(run), str(tmp_path / "afile")]) == 2
    assert main(["export", str(run), str(tmp_path / "afile" / "sub")]) == 2
    err = capsys.readouterr().err
    assert "not an empty folder; choose a new OUT_DIR" in err and "Traceback" not in err
    assert [p.name for p in busy.iterdir()] == ["keep.txt"] and (busy / "keep.txt").read_text() == "mine"
    assert (tmp_path / "afile").read_text() == "mine"


def test_export_onto_a_full_disk_while_writing_the_tokenizer_leaves_nothing(tiny_model_dir, tmp_path, capsys,
                                                                           monkeypatch):
    import errno

    from transformers import PreTrainedTokenizerBase

    run = _train(tiny_model_dir, tmp_path / "runs", "r")

    def full(self, folder, *a, **k):
        (Path(folder) / "tokenizer.json").write_text("{")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(PreTrainedTokenizerBase, "save_pretrained", full)
    (tmp_path / "made").mkdir()
    assert main(["export", str(run), str(tmp_path / "new")]) == 2
    assert main(["export", str(run), str(tmp_path / "made")]) == 2
    err = capsys.readouterr().err
    assert "disk full" in err and "Traceback" not in err
    assert not (tmp_path / "new").exists() and not list(tmp_path.glob(".new*"))
    assert (tmp_path / "made").is_dir() and not list((tmp_path / "made").iterdir())


def test_rollwise_eval_of_a_learned_position_model_past_its_context_is_said_before_generating(tmp_path, capsys):
    """GPT-2's positions are a table: `rollwise train` refused a setting that did not fit, `rollwise eval` generated
    past it and died with an IndexError traceback."""
    from safetensors.torch import save_file

    folder = build_variant(tmp_path / "gpt2", arch="gpt2")
    config = json.loads((folder / "config.json").read_text())
    config["n_positions"] = 40
    (folder / "config.json").write_text(json.dumps(config))
    weights = load_file(str(folder / "model.safetensors"))
    weights["transformer.wpe.weight"] = weights["transformer.wpe.weight"][:40].contiguous()
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    args = ["eval", str(folder), "model.dtype=float32", "data.eval_size=4", "run.torch_threads=1",
            "data.tasks=[{name: chain_sum, params: {min_terms: 2, max_terms: 2, max_digits: 1}}]",
            "reward.functions=[{name: 'rewards_for_tests:digit_share'}]"]
    assert main([*args, "rollout.max_completion_length=30"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "exceeds the model's context length (40" in err and "learned table" in err
