"""Model loading: local folders never reach the network, damaged config.json files are named, weights must match."""

import json
import shutil
import socket

import pytest

from rollwise.models import ModelError, load_model, load_tokenizer, resolve_model_path


class _Retried(BaseException):
    """Raised where the hub client would wait to retry a request: escapes its retries, so the test fails at once."""


@pytest.fixture
def no_network(monkeypatch):
    """A machine without network, for a user who did not set HF_HUB_OFFLINE."""
    import huggingface_hub.constants
    import huggingface_hub.utils._http as hub_http

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)

    def lookup(*args, **kwargs):
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    def sleep(seconds):
        raise _Retried(f"the hub client waits {seconds} s to retry")

    monkeypatch.setattr(socket, "getaddrinfo", lookup)
    monkeypatch.setattr(hub_http.time, "sleep", sleep)


def test_a_hub_id_not_in_the_cache_offline_names_the_way_out(monkeypatch):
    """A hub id downloads as transformers does; offline (HF_HUB_OFFLINE=1) an uncached one is said at once, with
    the ways to get it."""
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    hub_id = "rollwise-audit/not-in-any-cache"
    assert resolve_model_path(hub_id) == hub_id
    with pytest.raises(ModelError, match=r"could not load tokenizer .*hf download.*HF_HUB_OFFLINE"):
        load_tokenizer(hub_id)
    with pytest.raises(ModelError, match=r"could not load model .*hf download.*HF_HUB_OFFLINE"):
        load_model(hub_id)


def test_a_local_folder_loads_without_the_network(tiny_model_dir, no_network):
    tok = load_tokenizer(str(tiny_model_dir))
    assert tok.pad_token_id is not None and tok.chat_template
    assert load_model(str(tiny_model_dir)).config.num_hidden_layers == 2


@pytest.mark.parametrize("config, says", [
    ("{}", "model_type"),
    ('{"model_type": "llama_from_the_future"}', "llama_from_the_future"),
    ('{"model_type": "llama", ', "not a valid JSON"),
])
def test_a_config_json_transformers_cannot_read_is_named_before_the_run(tiny_model_dir, tmp_path, capsys, config,
                                                                         says):
    """Beside good weights and tokenizer, an unreadable config.json was a traceback from train's setup."""
    from test_e2e import _args

    from rollwise.cli import main

    folder = tmp_path / "model"
    shutil.copytree(tiny_model_dir, folder)
    (folder / "config.json").write_text(config)
    with pytest.raises(ModelError, match=rf"'{folder}': its config.json cannot be read: .*{says}.*restore"):
        resolve_model_path(str(folder))
    assert main(["train", *_args(folder, tmp_path / "runs", "r", 1)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "config.json cannot be read" in err
    assert not (tmp_path / "runs" / "r").exists()


def test_weights_that_do_not_match_config_json_are_an_error_not_random_layers(tiny_model_dir, tmp_path):
    """A config.json naming one more layer than the weights hold loaded, with that layer drawn at random and only a
    log line: the run would train from partly random weights."""
    folder = tmp_path / "model"
    shutil.copytree(tiny_model_dir, folder)
    config = json.loads((folder / "config.json").read_text())
    config["num_hidden_layers"] += 1
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelError, match=r"do not match its config.json: \d+ weights are missing \(model.layers.2"):
        load_model(str(folder))
    assert load_model(str(tiny_model_dir)) is not None  # tied embeddings are not counted as missing
