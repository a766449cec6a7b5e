"""Defaults for framejit.compile options (``options={...}`` overrides them per call)."""

# Compiled versions kept per code object and compile() call before the frame runs in plain
# Python for new inputs (with one warning).
recompile_limit = 8
