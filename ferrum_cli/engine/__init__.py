"""The engine: Whisper on windows of speech. The batched engine (batched.py) is the default;
the sequential engine (sequential.py) is openai-whisper's own loop."""
