"""openai-whisper's tokenizer, with the list that costs each cold start the most read from our cache,
and user text (prompts, hotwords) encoded as text even where it spells a special token."""

from __future__ import annotations


def get_tokenizer(multilingual: bool, *, num_languages: int = 99, language: str | None = None, task: str | None = None):
    """openai-whisper's tokenizer; its non-speech token list (a regex over every special token,
    compiled at each start) is computed once and remembered. Its encode() takes '<|endoftext|>' in a
    prompt as plain text: tiktoken raises on it by default, which failed the input (or the server's engine)."""
    from whisper.tokenizer import get_tokenizer as whisper_tokenizer

    from ..weights.cache import remembered

    tokenizer = whisper_tokenizer(multilingual, num_languages=num_languages, language=language, task=task)
    if "non_speech_tokens" not in tokenizer.__dict__:
        name = f"non-speech-tokens-{tokenizer.encoding.name}"
        tokens = remembered(name, lambda: list(tokenizer.non_speech_tokens))
        if isinstance(tokens, list) and all(isinstance(t, int) for t in tokens):
            tokenizer.__dict__["non_speech_tokens"] = tuple(tokens)
    if "encode" not in tokenizer.__dict__:  # the instance is openai-whisper's cached one: its transcribe() too
        encoding = tokenizer.encoding
        plain = {"disallowed_special": ()}
        tokenizer.__dict__["encode"] = lambda text, **kwargs: encoding.encode(text, **{**plain, **kwargs})
    return tokenizer
