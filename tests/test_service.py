"""The long-lived engine (EngineService) under faults: one input's fault fails that input, and a
fault the engine cannot go past fails everything at once and says so, never a silent hang."""

from __future__ import annotations

import threading

import pytest

from ferrum_cli.audio.ffmpeg import decode_file
from ferrum_cli.engine.batched import BatchedEngine
from ferrum_cli.engine.service import EngineService, Ticket
from ferrum_cli.errors import ServiceError
from ferrum_cli.options import TranscribeOptions
from ferrum_cli.results import Transcription

from .helpers import SAMPLE


class Outcome:
    """A ticket's result, waited for from the test's thread."""

    def __init__(self) -> None:
        self.result, self.done = None, threading.Event()

    def ticket(self, options: TranscribeOptions = TranscribeOptions()) -> Ticket:
        def on_done(result) -> None:
            self.result = result
            self.done.set()

        return Ticket(lambda: iter(decode_file(SAMPLE)), options, lambda segment, language: None, on_done)

    def wait(self):
        assert self.done.wait(300), "the ticket was never finished"
        return self.result


@pytest.fixture
def service(executor):
    running = executor.serve()
    yield running
    running.close(60)


def test_a_fault_inside_a_batch_fails_its_input_and_the_next_input_is_served(service, monkeypatch):
    real = BatchedEngine._decode_next_batch
    calls = []

    def faulty(self):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("injected fault in a batch")
        return real(self)

    monkeypatch.setattr(BatchedEngine, "_decode_next_batch", faulty)
    first, second = Outcome(), Outcome()
    service.submit(first.ticket(TranscribeOptions(language="en")))
    failed = first.wait()
    assert isinstance(failed, ServiceError) and "RuntimeError" in failed.message
    service.submit(second.ticket(TranscribeOptions(language="en")))
    served = second.wait()
    assert isinstance(served, Transcription) and "Dashwood" in served.text
    assert service.failed is None


def test_options_no_engine_can_run_fail_that_input_alone(service, monkeypatch):
    real_init = BatchedEngine.__init__

    def refuse_translation(self, model, options, *events_and_order):
        if options.task == "translate":
            raise ValueError("injected: no engine for these options")
        real_init(self, model, options, *events_and_order)

    monkeypatch.setattr(BatchedEngine, "__init__", refuse_translation)
    refused, served = Outcome(), Outcome()
    service.submit(refused.ticket(TranscribeOptions(task="translate")))
    service.submit(served.ticket(TranscribeOptions(language="en")))
    assert isinstance(refused.wait(), ServiceError)
    assert "Dashwood" in served.wait().text


def test_a_fault_the_engine_cannot_go_past_fails_everything_and_calls_on_fatal(executor, monkeypatch):
    def broken(self):
        raise RuntimeError("injected fault in the engine's loop")

    monkeypatch.setattr(EngineService, "_take_submitted", broken)
    service = EngineService(executor._require_model())
    fatal = []
    service.on_fatal = fatal.append
    try:
        waiting = Outcome()
        service.submit(waiting.ticket())
        result = waiting.wait()
        assert isinstance(result, ServiceError) and "stopped" in result.message
        assert fatal == [service.failed] and service.failed is not None
        with pytest.raises(ServiceError, match="stopped"):
            service.submit(Outcome().ticket())
    finally:
        service.close(10)


def test_a_callback_that_raises_does_not_stop_the_engine(service):
    def on_done(result) -> None:
        raise RuntimeError("the caller's own bug")

    service.submit(Ticket(lambda: iter(decode_file(SAMPLE)), TranscribeOptions(), lambda s, lang: None, on_done))
    after = Outcome()
    service.submit(after.ticket())
    assert "Dashwood" in after.wait().text and service.failed is None
