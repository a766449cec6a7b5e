"""Defaults for framejit.compile options (``options={...}`` overrides them per call)."""

# Compiled versions kept per code object and compile() call before the frame runs in plain
# Python for new inputs (with one warning).
recompile_limit = 8

# Graphs compiled inside a DistributedDataParallel forward are split at DDP's gradient buckets
# and compiled piece by piece, so each bucket's all-reduce can start while the backward goes on
# (backends other than framejit's own; see framejit/_distributed.py). Read at each compile.
optimize_ddp = True

# Under torch.distributed (a process group of 2 or more ranks): every compile of a DDP model or
# of a model with fully_shard-ed parts is compared with the other ranks' through the group's
# store, and raises framejit.RankDivergence naming the guard when they differ. "auto": those
# models; True: every compiled function and module; False: no check.
check_ranks = "auto"
# How long a rank that compiled waits for the others to compile the same (seconds).
rank_check_timeout_s = 30.0
