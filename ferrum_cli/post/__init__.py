"""The post-processing stage: one input's transcription after the engine, before the writers
(segments -> word times -> speakers)."""

from .stage import PostProcess

__all__ = ["PostProcess"]
