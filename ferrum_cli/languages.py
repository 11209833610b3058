"""Whisper's languages, read without torch: openai-whisper keeps its table in whisper.tokenizer,
and importing that imports the whole package (torch, 1.5 s) before a language option is checked.
The table is read from that module's source, so it is always openai-whisper's own."""

from __future__ import annotations

import ast
import importlib.util
import re
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path

from .errors import UsageError


@lru_cache(maxsize=1)
def languages() -> tuple[dict[str, str], dict[str, str]]:
    """(code -> English name, English name or alias -> code), as whisper.tokenizer's LANGUAGES
    and TO_LANGUAGE_CODE."""
    spec = importlib.util.find_spec("whisper")  # finds the package without running its __init__
    source = Path(spec.submodule_search_locations[0], "tokenizer.py").read_text(encoding="utf-8")
    tables = {
        node.targets[0].id: node.value
        for node in ast.parse(source).body
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
    }
    names = ast.literal_eval(tables["LANGUAGES"])
    aliases = tables["TO_LANGUAGE_CODE"]  # {**{name: code for code, name in LANGUAGES.items()}, alias: code, ...}
    to_code = {name: code for code, name in names.items()}
    to_code |= {ast.literal_eval(k): ast.literal_eval(v) for k, v in zip(aliases.keys, aliases.values) if k is not None}
    return names, to_code


def language_codes(given: Iterable[str]) -> tuple[str, ...]:
    """language_code of each, in order, once each; "auto" and blanks add none."""
    return tuple(dict.fromkeys(code for code in map(language_code, given) if code))


def language_code(language: str) -> str | None:
    """openai-whisper's code for a language given by code, English name, or a tag with a region or
    script as browsers and locales write them (pt-BR, en_US, zh-Hans: Whisper has no variants, so
    the language's own code); None for "auto"."""
    if not isinstance(language, str):
        raise UsageError(f"a language is a code or an English name, not {type(language).__name__}")
    names, to_code = languages()
    name = language.strip().lower()
    if name in ("auto", ""):
        return None
    code = to_code.get(name, name)
    if code not in names and (primary := re.split(r"[-_]", code, maxsplit=1)[0]) in names:
        code = primary
    if code not in names:
        raise UsageError(f"unknown language {language!r}")
    return code


def language_name(code: str) -> str:
    """The English name of a code ("english"), as OpenAI's verbose_json gives it; the code if unknown."""
    return languages()[0].get(code, code)
