"""The private parts of openai-whisper that ferrum builds on. pyproject.toml bounds its version;
a release that renames one of these fails here, by name, before anything subtler breaks."""

from __future__ import annotations

import functools
import inspect
import re

import whisper
import whisper.decoding as decoding
from whisper.tokenizer import Tokenizer


def _parameters(func) -> list[str]:
    return list(inspect.signature(func).parameters)


def test_model_tables_that_weights_locations_reads():
    assert isinstance(whisper._MODELS, dict) and "base" in whisper._MODELS and "tiny.en" in whisper._MODELS
    assert whisper._MODELS["base"].startswith("https://") and len(whisper._MODELS["base"].split("/")[-2]) == 64
    assert isinstance(whisper._ALIGNMENT_HEADS, dict) and set(whisper._ALIGNMENT_HEADS) <= set(whisper._MODELS)
    assert _parameters(whisper._download)[:3] == ["url", "root", "in_memory"]


def test_decoding_task_methods_that_the_engine_overrides():
    task = decoding.DecodingTask
    assert _parameters(task._detect_language) == ["self", "audio_features", "tokens"]
    assert _parameters(task._get_audio_features) == ["self", "mel"]
    assert _parameters(task._main_loop) == ["self", "audio_features", "tokens"]
    init = inspect.getsource(task.__init__)
    attributes = ("logit_filters", "n_group", "sample_begin", "sot_index", "initial_tokens", "decoder", "inference")
    for attribute in attributes:
        assert re.search(rf"self\.{attribute}\b[^=\n]*=", init), attribute


def test_pieces_the_decoder_and_tokenizer_reuse():
    assert _parameters(decoding.SuppressBlank.__init__) == ["self", "tokenizer", "sample_begin"]
    assert _parameters(decoding.PyTorchInference.__init__) == ["self", "model", "initial_token_length"]
    # the tokenizer's non-speech list is cached per instance: ferrum fills the cache from its own
    assert isinstance(inspect.getattr_static(Tokenizer, "non_speech_tokens"), functools.cached_property)


def test_the_language_table_read_without_torch_is_openai_whispers():
    """ferrum_cli.languages reads whisper/tokenizer.py's source, so that checking -l needs no torch."""
    import subprocess
    import sys

    from whisper.tokenizer import LANGUAGES, TO_LANGUAGE_CODE

    from ferrum_cli.languages import languages

    assert languages() == (LANGUAGES, TO_LANGUAGE_CODE)
    check = "import sys; from ferrum_cli.languages import language_code; language_code('German'); print(sys.modules)"
    assert subprocess.run([sys.executable, "-c", check], capture_output=True, text=True).stdout.count("'torch") == 0
