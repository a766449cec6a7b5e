"""Defaults for framejit.compile options (``options={...}`` overrides them per call)."""

# Compiled versions kept per code object and compile() call before the frame runs in plain
# Python for new inputs (with one warning).
recompile_limit = 8

# Graphs compiled inside a DistributedDataParallel forward are split at DDP's gradient buckets
# and compiled piece by piece, so each bucket's all-reduce can start while the backward goes on
# (backends other than framejit's own; see framejit/_distributed.py). Read at each compile.
optimize_ddp = True
