"""The `ferrum` command: parses options, calls the library, renders with rich."""

from .app import app, main

__all__ = ["app", "main"]
