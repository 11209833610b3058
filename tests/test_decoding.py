"""The static-cache decoder against openai-whisper's own decoder forward, on real audio."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ferrum_cli.engine.decoding import StaticCacheInference

from .helpers import JFK, corpus, needs_corpus


@needs_corpus
def test_folded_cross_attention_gives_openai_whisper_logits(executor):
    from whisper.audio import log_mel_spectrogram, pad_or_trim

    from ferrum_cli.audio.ffmpeg import decode_file

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

    from ferrum_cli.engine.decoding import BlankSuppression

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

    from ferrum_cli.audio.ffmpeg import decode_file
    from ferrum_cli.engine.encoder import encode_windows

    model = executor._model
    features = encode_windows(model, [decode_file(corpus(JFK)).samples], "bfloat16")
    lengths = []
    for sample_len in (1, 5, 224):
        options = DecodingOptions(language="en", temperature=0.0, fp16=False, sample_len=sample_len)
        lengths.append(len(model.decode(features, options, fast_cache_dtype=torch.bfloat16)[0].tokens))
    assert lengths[:2] == [1, 5] and 5 < lengths[2] < 224  # cut at the limit; the whole text ends by itself


def test_end_of_text_is_masked_only_where_a_segment_just_closed_before_more_speech():
    from whisper.tokenizer import get_tokenizer

    from ferrum_cli.engine.decoding import SpeechContinuation

    tokenizer = get_tokenizer(True, num_languages=99, language="en", task="transcribe")
    stamp = tokenizer.timestamp_begin
    unfinished = torch.zeros(4, 1501, dtype=torch.bool)
    unfinished[:, :500] = True  # speech goes on until 10 s into each window
    tokens = torch.tensor(
        [
            [1, 2, 3, stamp + 0, 400, stamp + 100],  # a segment closed at 2 s
            [1, 2, 3, stamp + 0, 400, stamp + 600],  # closed at 12 s: nothing follows
            [1, 2, 3, stamp + 0, 400, 401],  # inside a segment: end-of-text ends it with the window
            [1, 2, 3, stamp + 0, 400, stamp + 100],
        ]
    )
    continuation = SpeechContinuation(tokenizer, sample_begin=3, unfinished=unfinished)
    continuation.unfinished[3] = False  # a window whose speech ended
    logits = torch.zeros(4, tokenizer.timestamp_begin + 1501)
    continuation.apply(logits, tokens)
    assert torch.isinf(logits[:, tokenizer.eot]).tolist() == [True, False, False, False]
    assert torch.isinf(logits).sum() == 1

    continuation.keep_rows(torch.tensor([False, True, True, True]))  # the first row finished
    logits = torch.zeros(3, tokenizer.timestamp_begin + 1501)
    continuation.apply(logits, tokens[1:])
    assert not torch.isinf(logits).any()
    continuation.apply(logits[:1], tokens[:1, :3])  # nothing sampled yet: nothing to judge
    assert not torch.isinf(logits).any()


@needs_corpus
def test_a_row_told_that_speech_goes_on_does_not_end_before_it_while_other_rows_leave(executor):
    """Rows leave the batch as they end; each row's table must leave with it."""
    import numpy as np
    from whisper.decoding import DecodingOptions
    from whisper.tokenizer import get_tokenizer

    from ferrum_cli.audio.constants import SAMPLE_RATE
    from ferrum_cli.audio.ffmpeg import decode_file
    from ferrum_cli.engine.encoder import encode_windows

    model = executor._model
    jfk = decode_file(corpus(JFK)).samples
    short = jfk[: 3 * SAMPLE_RATE]  # ends first, and leaves the batch
    features = encode_windows(model, [short, jfk, jfk], "bfloat16")
    options = DecodingOptions(language="en", temperature=0.0, fp16=False)
    plain = model.decode(features, options, fast_cache_dtype=torch.bfloat16)
    unfinished = torch.zeros(3, 1501, dtype=torch.bool)
    unfinished[2, :900] = True  # as if speech went on until 20 s in the third window
    told = model.decode(features, options, fast_cache_dtype=torch.bfloat16, unfinished=unfinished)
    assert [r.tokens for r in told[:2]] == [r.tokens for r in plain[:2]]
    begin = get_tokenizer(model.is_multilingual, num_languages=model.num_languages).timestamp_begin
    stamps = [t - begin for t in told[2].tokens if t >= begin]
    assert stamps and stamps[-1] >= 900  # no end-of-text right after a segment closed before 18 s
    assert told[2].tokens[: len(plain[2].tokens) - 1] == plain[2].tokens[:-1]  # the same up to its old end
    assert len(told[2].tokens) > len(plain[2].tokens) and np.isfinite(told[2].avg_logprob)


@needs_corpus
def test_best_of_n_sampling_decodes_each_window_of_a_batch(executor):
    """openai-whisper repeats the tokens for the n candidates but not the audio features;
    the batched engine's loop needs one feature row per candidate."""
    from whisper.decoding import DecodingOptions

    from ferrum_cli.audio.constants import SAMPLE_RATE
    from ferrum_cli.audio.ffmpeg import decode_file
    from ferrum_cli.engine.encoder import encode_windows

    model = executor._model
    jfk = decode_file(corpus(JFK)).samples
    features = encode_windows(model, [jfk[: 3 * SAMPLE_RATE], jfk], "bfloat16")
    options = DecodingOptions(language="en", temperature=0.4, best_of=3, fp16=False)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        short, whole = model.decode(features, options, fast_cache_dtype=torch.bfloat16)
    assert "fellow" in short.text.lower() and "country" not in short.text.lower()
    assert "ask not what your country" in whole.text.lower()
    assert short.temperature == whole.temperature == 0.4


@needs_corpus
@pytest.mark.parametrize("patience", [1.0, 0.5])
def test_beam_search_reads_a_batch_of_windows_as_openai_whisper_reads_each_alone(executor, patience):
    """Beam search in the batched engine: the beams of several windows share each step, a window
    whose candidates are found leaves the batch (the 3 s one first), and each window's text is
    openai-whisper's own beam search's on that window alone. With patience under 1 a window is done
    before all its beams are: kept in the batch, they grew on, and the 3 s window's text became
    "And so, my fellow Americans! ... ... ..." where alone it is "And so, my fellow Americans!"."""
    from whisper.decoding import DecodingOptions
    from whisper.decoding import decode as openai_whisper_decode

    from ferrum_cli.audio.constants import SAMPLE_RATE
    from ferrum_cli.audio.ffmpeg import decode_file
    from ferrum_cli.engine.encoder import encode_windows

    model = executor._model
    jfk, other = decode_file(corpus(JFK)).samples, decode_file(corpus("en_ljspeech_LJ001-0001.flac")).samples
    features = encode_windows(model, [jfk[: 3 * SAMPLE_RATE], jfk, other], "float32")
    options = DecodingOptions(language="en", beam_size=3, patience=patience, fp16=False)
    batched = model.decode(features, options, fast_cache_dtype=torch.float32)
    for row, ours in enumerate(batched):
        theirs = openai_whisper_decode(model, features[row], options)  # its own loop and caches, alone
        assert ours.text == theirs.text, row
        assert ours.avg_logprob == pytest.approx(theirs.avg_logprob, abs=1e-3)
    assert "country" not in batched[0].text.lower() and "ask not what your country" in batched[1].text.lower()


@needs_corpus
@pytest.mark.parametrize("cache_dtype", [torch.float16, torch.bfloat16])
def test_beam_search_reads_a_window_alike_alone_and_in_a_batch_in_half_precision(executor, cache_dtype):
    """The features a window's beams share, in the engine's half-precision caches: float16
    products packed once a window (AVX2's path), bfloat16 taken a window at a time."""
    from whisper.decoding import DecodingOptions

    from ferrum_cli.audio.constants import SAMPLE_RATE
    from ferrum_cli.audio.ffmpeg import decode_file
    from ferrum_cli.engine.encoder import encode_windows

    model = executor._model
    jfk, other = decode_file(corpus(JFK)).samples, decode_file(corpus("en_ljspeech_LJ001-0001.flac")).samples
    features = encode_windows(model, [other, jfk[: 3 * SAMPLE_RATE], jfk], "float32")
    options = DecodingOptions(language="en", beam_size=3, fp16=False)
    batched = model.decode(features, options, fast_cache_dtype=cache_dtype)
    alone = [model.decode(features[row : row + 1], options, fast_cache_dtype=cache_dtype)[0] for row in range(3)]
    assert [r.text for r in batched] == [r.text for r in alone]
    assert [r.tokens for r in batched] == [r.tokens for r in alone]
    assert "ask not what your country" in batched[2].text.lower()


@needs_corpus
def test_beams_and_samples_hold_their_windows_features_once(executor, monkeypatch):
    """openai-whisper's run() repeats the features for every beam and sample, copies the beam
    loop never read. Beam search keeps one row a window; only best-of-n sampling, whose rows go
    their own ways, repeats them, in its own loop."""
    from whisper.decoding import DecodingOptions

    from ferrum_cli.audio.constants import SAMPLE_RATE
    from ferrum_cli.audio.ffmpeg import decode_file
    from ferrum_cli.engine.decoding import FerrumDecodingTask
    from ferrum_cli.engine.encoder import encode_windows

    rows_read, main_loop = [], FerrumDecodingTask._main_loop

    def counting(task, audio_features, tokens):
        rows_read.append(audio_features.shape[0])
        return main_loop(task, audio_features, tokens)

    monkeypatch.setattr(FerrumDecodingTask, "_main_loop", counting)
    jfk = decode_file(corpus(JFK)).samples
    features = encode_windows(executor._model, [jfk[: 3 * SAMPLE_RATE], jfk], "float32")
    beams = executor._model.decode(features, DecodingOptions(language="en", beam_size=5, fp16=False),
                                   fast_cache_dtype=torch.float32)  # fmt: skip
    assert rows_read == [2] and "ask not what your country" in beams[1].text.lower()
    samples = executor._model.decode(features, DecodingOptions(language="en", temperature=0.5, best_of=3, fp16=False),
                                     fast_cache_dtype=torch.float32)  # fmt: skip
    assert rows_read == [2, 2] and "country" in samples[1].text.lower()
    assert all(window.token_logprobs and len(window.token_logprobs) == len(window.tokens) for window in samples)


x86_fbgemm = pytest.mark.skipif(
    "fbgemm" not in torch.backends.quantized.supported_engines, reason="fbgemm's float16-weight products are x86's"
)


def small_model(float16_exact: bool):
    """A two-layer Whisper with random weights; `float16_exact`: every weight a float16 value."""
    from whisper.model import ModelDimensions

    from ferrum_cli.engine.model import FerrumWhisper

    torch.manual_seed(0)
    dims = ModelDimensions(80, 1500, 64, 2, 2, 51865, 448, 64, 2, 2)
    model = FerrumWhisper(dims).eval()
    with torch.no_grad():
        model.decoder.positional_embedding.normal_(0, 0.02)  # openai-whisper leaves it uninitialized
        if float16_exact:
            for p in model.parameters():
                p.copy_(p.half().float())
    return model


@x86_fbgemm
def test_float16_weight_products_are_taken_only_where_float16_holds_the_weights():
    from ferrum_cli.engine.decoding import _half_weight_products

    assert _half_weight_products(small_model(float16_exact=False)) is None  # no weight is rounded
    model = small_model(float16_exact=True)
    products = _half_weight_products(model)
    assert products is not None
    assert _half_weight_products(model) is products  # packed once per model

    x = torch.randn(3, 2, 64)
    torch.testing.assert_close(products.project(x), x @ model.decoder.token_embedding.weight.T, atol=1e-4, rtol=1e-5)
    block = model.decoder.blocks[1]
    torch.testing.assert_close(products.mlp(block.mlp, x), block.mlp(x), atol=1e-4, rtol=1e-5)
    for layer in (block.attn.query, block.attn.key, block.cross_attn.out):  # key: a layer without bias
        torch.testing.assert_close(products.linear(layer, x), layer(x), atol=1e-4, rtol=1e-5)


@x86_fbgemm
@needs_corpus
def test_a_batch_on_float16_weight_products_gives_openai_whisper_logits(executor):
    """The pack's weights are float16, so the float32 decoder's products may read them as such."""
    from whisper.audio import log_mel_spectrogram, pad_or_trim

    from ferrum_cli.audio.ffmpeg import decode_file

    model = executor._model
    mel = pad_or_trim(log_mel_spectrogram(torch.from_numpy(decode_file(corpus(JFK)).samples)), 3000)[None]
    tokens = torch.tensor([[50258, 50259, 50359, 50363, 400, 370, 11, 452]]).repeat(4, 1)
    with torch.no_grad():
        features = model.encoder(mel).repeat(4, 1, 1)
        expected = model.decoder(tokens, features)
        inference = StaticCacheInference(model, initial_token_length=4, sot_index=0, cache_dtype=torch.float32)
        first = inference.logits(tokens[:, :4], features)
        steps = [inference.logits(tokens[:, : n + 1], features) for n in range(4, 8)]
    assert inference.half_weights is not None
    torch.testing.assert_close(first[:, 1], expected[:, 3], atol=1e-3, rtol=1e-4)
    for n, step in zip(range(4, 8), steps):
        torch.testing.assert_close(step[:, 0], expected[:, n], atol=1e-3, rtol=1e-4)


@needs_corpus
@pytest.mark.parametrize(
    "cache_dtype, atol, rtol",
    [
        (torch.bfloat16, 0.15, 0.02),  # the features in bfloat16, their cross-attention as two products on a CPU
        pytest.param(torch.float16, 0.02, 0.002, marks=x86_fbgemm),  # read as fbgemm float16 weights, float32 sums
    ],
)
def test_half_precision_features_give_openai_whisper_next_tokens(executor, cache_dtype, atol, rtol):
    """With the features in half precision, the logits stay within its rounding of
    openai-whisper's (float16's far inside bfloat16's), and every step picks the same token."""
    from whisper.audio import log_mel_spectrogram, pad_or_trim

    from ferrum_cli.audio.ffmpeg import decode_file

    model = executor._model
    mel = pad_or_trim(log_mel_spectrogram(torch.from_numpy(decode_file(corpus(JFK)).samples)), 3000)[None]
    tokens = torch.tensor([[50258, 50259, 50359, 50363, 400, 370, 11, 452, 7177, 6280, 11, 1029]]).repeat(4, 1)
    with torch.no_grad():
        features = model.encoder(mel).repeat(4, 1, 1)
        expected = model.decoder(tokens, features)
        inference = StaticCacheInference(model, initial_token_length=4, sot_index=0, cache_dtype=cache_dtype)
        inference.logits(tokens[:, :4], features)
        assert (inference.half_features is not None) == (cache_dtype == torch.float16)
        steps = torch.cat([inference.logits(tokens[:, : n + 1], features) for n in range(4, 12)], dim=1)
    assert torch.equal(steps.argmax(-1), expected[:, 4:12].argmax(-1))
    torch.testing.assert_close(steps, expected[:, 4:12], atol=atol, rtol=rtol)


def test_float16_features_fall_back_to_the_models_dtype_where_fbgemm_cannot_hold_the_weights():
    model = small_model(float16_exact=False)
    with torch.no_grad():
        inference = StaticCacheInference(model, initial_token_length=4, sot_index=0, cache_dtype=torch.float16)
        inference.logits(torch.randint(0, 50000, (2, 4)), torch.randn(2, 1500, 64))
    assert inference.half_features is None and inference.features.dtype == torch.float32


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_rows_that_leave_the_batch_leave_the_others_as_if_decoded_alone(cache_dtype):
    """keep_rows moves the remaining rows' caches up in place; what they compute stays theirs."""
    model = small_model(float16_exact=True)
    torch.manual_seed(1)
    features = torch.randn(4, 1500, 64)
    given = features.clone()
    tokens = torch.randint(0, 50000, (4, 9))
    kept = torch.tensor([False, True, False, True])
    with torch.no_grad():
        batch = StaticCacheInference(model, initial_token_length=4, sot_index=0, cache_dtype=cache_dtype)
        alone = StaticCacheInference(model, initial_token_length=4, sot_index=0, cache_dtype=cache_dtype)
        batch.logits(tokens[:, :4], features)
        alone.logits(tokens[kept, :4], features[kept])
        batch.logits(tokens[:, :5], features)
        alone.logits(tokens[kept, :5], features[kept])
        batch.keep_rows(kept)
        for n in range(6, 10):
            torch.testing.assert_close(
                batch.logits(tokens[kept, :n], None), alone.logits(tokens[kept, :n], None), atol=1e-4, rtol=1e-5
            )
    assert torch.equal(features, given)  # the caller's features are never written


@pytest.mark.parametrize("two_products", [False, True])
def test_bfloat16_features_are_attended_to_alike_alone_and_in_any_batch(two_products):
    """Both ways of the cross-attention over bfloat16 features (the faster is measured per CPU:
    attention.cpu_cross_attention_in_two_products) give a row the same numbers whatever shares its
    batch. torch's fused kernel keeps the softmax weights in float32; the two products round them."""
    from ferrum_cli.engine.attention import attend_features

    torch.manual_seed(0)
    queries, features = torch.randn(13, 8, 512), torch.randn(13, 1500, 512) * 0.05
    exact = F.scaled_dot_product_attention(queries[:, None], features[:, None], features[:, None], scale=1.0)[:, 0]
    half = attend_features(queries.bfloat16(), features.bfloat16(), two_products)
    alone = [
        attend_features(queries[i : i + 1].bfloat16(), features[i : i + 1].bfloat16(), two_products) for i in range(13)
    ]
    assert torch.equal(half, torch.cat(alone))
    assert ((half.float() - exact).norm() / exact.norm()).item() < (0.05 if two_products else 0.005)


@needs_corpus
@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_a_window_gets_the_same_logits_alone_and_in_any_batch(executor, cache_dtype):
    """A request's text must not depend on what shares its batch: the server batches requests
    that arrive together, and a file decoded alone must read as it does in a folder."""
    from whisper.audio import log_mel_spectrogram, pad_or_trim

    from ferrum_cli.audio.ffmpeg import decode_file

    model = executor._model
    clips = [JFK, "en_timit_LDC93S1.wav", "en_librispeech_61-70968-0000.flac", "en_librispeech_2830-3980-0043.wav"]
    mels = [pad_or_trim(log_mel_spectrogram(torch.from_numpy(decode_file(corpus(c)).samples)), 3000) for c in clips]
    tokens = torch.tensor([50258, 50259, 50359, 50364, 400, 370, 11, 452, 7177, 6280])
    with torch.no_grad():
        features = model.encoder(torch.stack(mels))

        def timit_logits(rows: list[int]) -> torch.Tensor:
            """The logits at each step of the row that holds window 1 (TIMIT); from the third step
            on, the rows at odd places after it have left the batch."""
            inference = StaticCacheInference(model, initial_token_length=3, sot_index=0, cache_dtype=cache_dtype)
            batch, at = tokens.repeat(len(rows), 1), rows.index(1)
            steps = [inference.logits(batch[:, :3], features[rows])[at]]
            for n in range(4, len(tokens) + 1):
                if n == 6 and len(rows) > at + 1:
                    keep = torch.tensor([i <= at or (i - at) % 2 == 0 for i in range(len(rows))])
                    inference.keep_rows(keep)
                    batch = batch[keep]
                steps.append(inference.logits(batch[:, :n], None)[at])
            return torch.cat(steps)

        alone = timit_logits([1])
        for rows in ([0, 1], [2, 1, 3], [0, 3, 2, 1], [3, 1, 0, 2, 0, 3, 2], [0, 1] + [2, 3] * 6, [2, 3] * 8 + [1, 0]):
            assert torch.equal(timit_logits(rows), alone), rows
