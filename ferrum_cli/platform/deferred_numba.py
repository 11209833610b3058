"""numba, which openai-whisper needs only to align word timestamps, imported on first use.

whisper.model imports whisper.transcribe, which imports whisper.timing, whose two @numba.jit
functions make every process that loads a model import numba, a tenth of a cold start.
While whisper.timing runs its body, `import numba` gets a stand-in whose jit() only records the
functions. The first call of either one imports numba and compiles both; numba itself compiles
at first call too, so nothing changes but when the import is paid.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from collections.abc import Callable, Sequence
from typing import Any

DEFERRING_MODULE = "whisper.timing"


class _DeferredNumba(types.ModuleType):
    """Stands in for numba in one module's namespace until one of its jitted functions is called."""

    def __init__(self) -> None:
        super().__init__("numba")
        self._pending: list[tuple[Callable, tuple, dict]] = []

    def jit(self, *args: Any, **kwargs: Any) -> Callable[[Callable], Callable]:
        def record(function: Callable) -> Callable:
            self._pending.append((function, args, kwargs))

            @functools.wraps(function)
            def first_call(*call_args: Any, **call_kwargs: Any) -> Any:
                self.compile_all()
                return function.__globals__[function.__name__](*call_args, **call_kwargs)

            return first_call

        return record

    def compile_all(self) -> None:
        """Compile every recorded function at once: one calls another inside nopython code,
        where the callee must already be a numba dispatcher in the module's globals."""
        import numba

        for function, args, kwargs in self._pending:
            function.__globals__[function.__name__] = numba.jit(*args, **kwargs)(function)
            function.__globals__["numba"] = numba
        self._pending.clear()


class _DeferringLoader(importlib.machinery.SourceFileLoader):
    def exec_module(self, module: types.ModuleType) -> None:
        stand_in = _DeferredNumba()
        sys.modules["numba"] = stand_in
        try:
            super().exec_module(module)
        finally:
            if sys.modules.get("numba") is stand_in:
                del sys.modules["numba"]


class _DeferringFinder(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != DEFERRING_MODULE or "numba" in sys.modules:
            return None  # a process that already paid for numba keeps it
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or not (spec.origin or "").endswith(".py"):
            return None
        return importlib.util.spec_from_file_location(
            fullname, spec.origin, loader=_DeferringLoader(fullname, spec.origin)
        )


def install() -> None:
    """Idempotent; takes effect only if whisper.timing has not been imported yet."""
    if not any(isinstance(finder, _DeferringFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _DeferringFinder())
