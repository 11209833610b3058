"""Facts about the audio every layer shares: its rate, Whisper's window and timestamps, the frames we measure in."""

SAMPLE_RATE = 16000  # Whisper's input: mono float32 at 16 kHz
WINDOW_SAMPLES = 30 * SAMPLE_RATE  # what Whisper's encoder reads at once
TIMESTAMP_SECONDS = 0.02  # Whisper's timestamp tokens are this far apart
TIMESTAMP_SAMPLES = SAMPLE_RATE // 50  # the same step in samples
VAD_FRAME = 512  # samples Silero VAD reads per step (32 ms), also the frame level is measured over
PAUSE_FRAME = SAMPLE_RATE // 50  # 20 ms: the frames whose energy places a cut in a pause
