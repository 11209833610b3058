"""The static-cache decoder against openai-whisper's own decoder forward, on real audio."""

from __future__ import annotations

import torch

from ferrum_cli.decoding import StaticCacheInference

from .conftest import JFK, corpus, needs_corpus


@needs_corpus
def test_folded_cross_attention_gives_openai_whisper_logits(executor):
    from whisper.audio import log_mel_spectrogram, pad_or_trim

    from ferrum_cli.audio import decode_file

    model = executor._model
    mel = pad_or_trim(log_mel_spectrogram(torch.from_numpy(decode_file(corpus(JFK)).samples)), 3000)[None]
    tokens = torch.tensor([[50258, 50259, 50359, 50363, 400, 370, 11, 452]])
    with torch.no_grad():
        features = model.encoder(mel)
        expected = model.decoder(tokens, features)  # [1, 8, vocab]: openai-whisper's attention, no cache
        inference = StaticCacheInference(model, initial_token_length=4, sot_index=0, cache_dtype=torch.float32)
        first = inference.logits(tokens[:, :4], features)
        steps = [inference.logits(tokens[:, : n + 1], features) for n in range(4, 8)]
    torch.testing.assert_close(first[:, 0], expected[:, 0], atol=1e-3, rtol=1e-4)
    torch.testing.assert_close(first[:, 1], expected[:, 3], atol=1e-3, rtol=1e-4)
    for n, step in zip(range(4, 8), steps):
        torch.testing.assert_close(step[:, 0], expected[:, n], atol=1e-3, rtol=1e-4)


def test_blank_suppression_masks_what_openai_whisper_masks():
    from whisper.decoding import SuppressBlank
    from whisper.tokenizer import get_tokenizer

    from ferrum_cli.decoding import BlankSuppression

    tokenizer = get_tokenizer(True, num_languages=99, language="en", task="transcribe")
    first_step, later_step = torch.zeros(1, 4, dtype=torch.long), torch.zeros(1, 5, dtype=torch.long)
    for tokens in (first_step, later_step):
        ours, theirs = torch.zeros(2, 51865), torch.zeros(2, 51865)
        BlankSuppression(tokenizer, sample_begin=4).apply(ours, tokens)
        SuppressBlank(tokenizer, sample_begin=4).apply(theirs, tokens)
        assert torch.equal(ours, theirs)
    assert torch.isinf(ours).sum() == 0 and torch.isinf(theirs).sum() == 0  # later steps: nothing masked
    BlankSuppression(tokenizer, sample_begin=4).apply(ours, first_step)
    assert torch.isinf(ours).sum() == 2 * 2  # " " and end-of-text, in both rows


@needs_corpus
def test_decoding_to_its_sample_length_fits_caches_sized_for_it(executor):
    """The static caches hold initial tokens + sample_len positions, not all 448."""
    from whisper.decoding import DecodingOptions

    from ferrum_cli.audio import decode_file
    from ferrum_cli.transcribe import encode_windows

    model = executor._model
    features = encode_windows(model, [decode_file(corpus(JFK)).samples], torch.bfloat16)
    lengths = []
    for sample_len in (1, 5, 224):
        options = DecodingOptions(language="en", temperature=0.0, fp16=False, sample_len=sample_len)
        lengths.append(len(model.decode(features, options, fast_cache_dtype=torch.bfloat16)[0].tokens))
    assert lengths[:2] == [1, 5] and 5 < lengths[2] < 224  # cut at the limit; the whole text ends by itself
