"""Audio: ffmpeg decodes any input to 16 kHz samples; level, VAD and windows turn them into
the windows of speech the engine decodes."""
