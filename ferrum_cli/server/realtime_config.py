"""A Realtime transcription session's settings, read from OpenAI's `session.update` (and the beta
`transcription_session.update`) and written back in the same shapes. Field names follow
openai-python's types/realtime/ (GA) and types/beta/realtime/ (beta)."""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field, replace

from .. import PcmFormat, TurnSettings

GA_FORMATS = {"audio/pcm": "pcm16", "audio/pcmu": "pcmu", "audio/pcma": "pcma"}
BETA_FORMATS = {"pcm16": "pcm16", "g711_ulaw": "pcmu", "g711_alaw": "pcma"}
PCM_RATES = (24000, 16000)  # OpenAI takes 24 kHz; 16 kHz is Whisper's own
G711_RATE = 8000
# semantic_vad's eagerness as server_vad's silence: ferrum has no model of turn ends, so it waits by the clock
SEMANTIC_SILENCE_MS = {"high": 500, "medium": 800, "auto": 800, "low": 1200}


class RealtimeError(Exception):
    """A client event that cannot be taken: an `error` event, and the session goes on."""

    def __init__(self, message: str, code: str | None = "invalid_value", param: str | None = None) -> None:
        super().__init__(message)
        self.message, self.code, self.param = message, code, param


@dataclass(frozen=True)
class Transcription:
    model: str | None = None  # as the client named it; any of OpenAI's transcription models is served by ferrum's
    language: str | None = None  # None: detected per item
    prompt: str | None = None


@dataclass(frozen=True)
class SessionConfig:
    id: str = field(default_factory=lambda: "sess_" + secrets.token_hex(12))
    format: PcmFormat = PcmFormat("pcm16", 24000)
    transcription: Transcription = Transcription()
    turns: TurnSettings | None = TurnSettings()  # None: the client commits
    turn_type: str | None = "server_vad"
    include: tuple[str, ...] = ()

    # -- GA: session.update ---------------------------------------------------------------

    def updated(self, session: object) -> SessionConfig:
        session = _object(session, "session")
        if session.get("type") not in (None, "transcription"):
            raise RealtimeError("ferrum serves transcription sessions only: set session.type to transcription",
                                param="session.type")  # fmt: skip
        config = replace(self, include=_include(session.get("include"), self.include))
        audio = _object(session.get("audio") or {}, "session.audio")
        given = _object(audio.get("input") or {}, "session.audio.input")
        if "format" in given and given["format"] is not None:
            config = replace(config, format=_ga_format(given["format"]))
        if "transcription" in given and given["transcription"] is not None:
            given_transcription = _transcription(given["transcription"], "session.audio.input.transcription")
            config = replace(config, transcription=given_transcription)
        if "turn_detection" in given:
            config = config._with_turns(given["turn_detection"], "session.audio.input.turn_detection")
        return config

    def session(self) -> dict:
        """The session object of session.created and session.updated."""
        return {
            "type": "transcription", "object": "realtime.transcription_session", "id": self.id,
            "audio": {"input": {
                "format": {"type": _ga_name(self.format.encoding), **({"rate": self.format.rate}
                                                                       if self.format.encoding == "pcm16" else {})},
                "transcription": self._transcription(), "turn_detection": self._turn_detection(),
                "noise_reduction": None,
            }},
            "include": list(self.include) or None,
        }  # fmt: skip

    # -- beta: transcription_session.update ---------------------------------------------

    def updated_beta(self, session: object) -> SessionConfig:
        session = _object(session, "session")
        config = replace(self, include=_include(session.get("include"), self.include))
        if session.get("input_audio_format") is not None:
            name = session["input_audio_format"]
            if name not in BETA_FORMATS:
                raise RealtimeError(f"input_audio_format must be one of {', '.join(BETA_FORMATS)}",
                                    param="session.input_audio_format")  # fmt: skip
            encoding = BETA_FORMATS[name]
            config = replace(config, format=PcmFormat(encoding, 24000 if encoding == "pcm16" else G711_RATE))
        if session.get("input_audio_transcription") is not None:
            given = session["input_audio_transcription"]
            config = replace(config, transcription=_transcription(given, "session.input_audio_transcription"))
        if "turn_detection" in session:
            config = config._with_turns(session["turn_detection"], "session.turn_detection")
        return config

    def session_beta(self) -> dict:
        name = {v: k for k, v in BETA_FORMATS.items()}[self.format.encoding]
        return {
            "id": self.id, "object": "realtime.transcription_session", "input_audio_format": name,
            "input_audio_transcription": self._transcription(), "turn_detection": self._turn_detection(),
            "modalities": ["text"], "include": list(self.include) or None,
        }  # fmt: skip

    # -- shared -------------------------------------------------------------------------

    def _transcription(self) -> dict:
        t = self.transcription
        return {"model": t.model or "whisper-1", "language": t.language, "prompt": t.prompt or ""}

    def _turn_detection(self) -> dict | None:
        if self.turns is None:
            return None
        t = self.turns
        return {"type": self.turn_type, "threshold": t.threshold, "prefix_padding_ms": t.prefix_padding_ms,
                "silence_duration_ms": t.silence_duration_ms}  # fmt: skip

    def _with_turns(self, given: object, param: str) -> SessionConfig:
        if given is None:
            return replace(self, turns=None, turn_type=None)
        given = _object(given, param)
        kind = given.get("type") or "server_vad"
        if kind not in ("server_vad", "semantic_vad"):
            raise RealtimeError("turn_detection.type must be server_vad or semantic_vad", param=f"{param}.type")
        base = self.turns or TurnSettings()
        if kind == "semantic_vad":
            eagerness = given.get("eagerness") or "auto"
            if eagerness not in SEMANTIC_SILENCE_MS:
                raise RealtimeError("eagerness must be low, medium, high or auto", param=f"{param}.eagerness")
            return replace(self, turns=replace(base, silence_duration_ms=SEMANTIC_SILENCE_MS[eagerness]),
                           turn_type=kind)  # fmt: skip
        threshold = _number(given, "threshold", base.threshold, 0.0, 1.0, param)
        padding = int(_number(given, "prefix_padding_ms", base.prefix_padding_ms, 0, 10_000, param))
        silence = int(_number(given, "silence_duration_ms", base.silence_duration_ms, 0, 10_000, param))
        return replace(self, turns=TurnSettings(threshold, padding, silence), turn_type=kind)


def _object(value: object, param: str) -> dict:
    if not isinstance(value, dict):
        raise RealtimeError(f"{param} must be an object", param=param)
    return value


def _number(given: dict, name: str, default: float, lo: float, hi: float, param: str) -> float:
    value = given.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not lo <= value <= hi:
        raise RealtimeError(f"{name} must be a number from {lo} to {hi}", param=f"{param}.{name}")
    return value


def _include(value: object, current: tuple[str, ...]) -> tuple[str, ...]:
    if value is None:
        return current
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise RealtimeError("include must be a list of strings", param="session.include")
    return tuple(value)


def _ga_format(given: object) -> PcmFormat:
    given = _object(given, "session.audio.input.format")
    name = given.get("type") or "audio/pcm"
    if name not in GA_FORMATS:
        raise RealtimeError(f"format.type must be one of {', '.join(GA_FORMATS)}",
                            param="session.audio.input.format.type")  # fmt: skip
    if GA_FORMATS[name] != "pcm16":
        return PcmFormat(GA_FORMATS[name], G711_RATE)
    rate = given.get("rate") or 24000
    if rate not in PCM_RATES:
        raise RealtimeError("audio/pcm rate must be 24000 (or 16000)", param="session.audio.input.format.rate")
    return PcmFormat("pcm16", rate)


def _ga_name(encoding: str) -> str:
    return {v: k for k, v in GA_FORMATS.items()}[encoding]


def _transcription(given: object, param: str) -> Transcription:
    given = _object(given, param)
    for name in ("model", "language", "prompt"):
        if given.get(name) is not None and not isinstance(given[name], str):
            raise RealtimeError(f"{name} must be a string", param=f"{param}.{name}")
    return Transcription(given.get("model") or None, given.get("language") or None, given.get("prompt") or None)
