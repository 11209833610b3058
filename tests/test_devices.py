"""Device and dtype choice that depends on the machine."""

from __future__ import annotations

import json

from ferrum_cli import devices


def test_the_bfloat16_choice_is_measured_once_per_machine_and_remembered(tmp_path, monkeypatch):
    monkeypatch.setenv("FERRUM_CACHE_DIR", str(tmp_path))
    first = devices.cpu_bf16_faster()
    remembered = list((tmp_path / "derived").glob("cpu-bf16-faster-*.json"))
    if not devices.cpu_has_native_bf16():
        assert first is False and remembered == []  # no bfloat16 instructions: nothing to measure
        return
    assert len(remembered) == 1 and json.loads(remembered[0].read_text()) is first
    remembered[0].write_text(json.dumps(not first))  # a later run reads the answer, not the clock
    assert devices.cpu_bf16_faster() is (not first)
