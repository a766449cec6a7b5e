"""framejit vs torch.compile (Dynamo) vs eager: front-end cost, per-call overhead and memory.

Run from the repository root:

    python3 benchmarks/run.py            # full run (~10-20 min on 2 cores)
    python3 benchmarks/run.py --quick    # smaller sizes, fewer repeats (<5 min)
    python3 benchmarks/run.py --quick --only backends   # one section only

With --only, the sections not run keep their tables from the previous results.json, marked with
the date of the run that measured them.

Everything runs side by side in this process (framejit, Dynamo with the same backends, eager),
except the 5,000-op traces of the full run, which run in a child process killed after
--cap seconds (default 180) so that one slow compiler cannot stall the run. Tables are printed
and written to benchmarks/results/results.md (plus results.json and, when matplotlib is
installed, results.png).

What is measured
  1. Front-end trace+compile time. Straight-line chains of 100 / 1,000 / 5,000 tensor ops
     (generated with exec), `for i in range(N): x = torch.sin(x) + 1` (N = 100, 1,000) and every
     model of tests/models/zoo.py (eval mode, batch 2), with a pass-through backend that returns gm.forward, so only the front end is timed. Time =
     first call (trace + compile + run) minus one eager call; reported in seconds, in
     microseconds per captured op (ops = call nodes of the FX graphs handed to the backend) and
     as the Dynamo/framejit ratio. framejit.reset() and torch._dynamo.reset() before each.
  2. Per-call overhead (cached path, under torch.no_grad()): `x + 1` on a 1-element tensor and a
     module with 100 Parameters used directly in a straight-line forward, with backend="eager";
     then the same module with a backend whose callable returns precomputed outputs, so only the
     compiler's hook, guards and input gathering are timed. min over interleaved timeit repeats.
  3. Memory: bytes retained per cached compiled function over N distinct small functions, by
     tracemalloc (Python's allocators only), glibc mallinfo2 (C++ new, libtorch, large Python
     blocks) and RSS (everything, coarse); and a weakref check that input tensors are not kept
     alive by the compiled code.
  4. End-to-end forward time per backend (under torch.no_grad(), models in eval mode): eager,
     framejit backend="eager" and "native", torch.compile backend="eager" and "inductor", on the
     same inputs: (a) 8 blocks of Linear(64,64)+LayerNorm+GELU at batch 1, (b) the zoo's GPT
     block at batch 1, (c) a compute-bound MLP Linear(1024,4096)+GELU+Linear(4096,1024) at batch
     64, (d) every model of tests/models/zoo.py at batch 2. µs per forward (min over interleaved
     repeats), eager/native, native/framejit-eager, native/inductor, and whether each compiled
     output matches eager (torch.allclose, rtol=1e-4, atol=1e-5).
  5. transformers (when installed): GPT2LMHeadModel, LlamaForCausalLM and
     BertForSequenceClassification from small random-weight configs (2 layers, hidden 64, vocab
     1000; HF_HUB_OFFLINE=1), eval under torch.no_grad(), batch 2 x 16 tokens: first call in ms
     (fresh compile, minus one eager call) and cached call in µs (min over interleaved repeats)
     for framejit backend "eager" and "native" and torch.compile backend "eager", next to eager;
     graphs compiled, and whether the logits match eager. Then a whole training step (forward
     with labels, backward, AdamW step, zero_grad) compiled as one function: the first step's
     ms (compiles included) and the median step, framejit eager and native vs torch.compile
     eager vs eager, and whether the parameters match eager's after the steps; for GPT2 and
     Llama the same again with activation checkpointing on (gradient_checkpointing_enable()).
  6. Dynamic shapes through inductor: 16 calls with 8 distinct batch sizes (each size twice, in
     a fixed shuffled order) of a plain function and of zoo models (eval, torch.no_grad()),
     framejit vs torch.compile with backend="inductor", each in a child process with its own
     empty inductor cache (both compile the same kernels: in one process the second compiler
     would find the first's): total wall time including compiles, graphs compiled, and whether
     every output matches eager. Each child first runs inductor's CPU probe (which vector ISA
     the compiler and CPU support: it builds and loads test libraries, about 8 s here, once per
     machine and cache directory, so a user pays it on the first compile ever); its time is
     shown apart and is not in the totals. A third column compiles framejit with dynamic=True:
     one symbolic compile from the first call, the fewest compiles possible. Each total is
     split into the seconds inside the backend call (importing inductor's compile_fx, about
     0.5 s on the first call, and running it) and outside it (the front end and the calls).
  6b. A decoding loop driven by an int position: one attention layer with a KV cache written
     and read at `start_pos` (Meta's reference Llama's forward(tokens, start_pos)), a prompt of
     8 tokens then 48 one-token steps (16 with --quick), under torch.no_grad(), in this process
     (the inductor rows each in a child with its own inductor cache, after its CPU probe, as in
     section 6):
     total wall time including compiles, graphs compiled and whether every output matches eager,
     for eager, framejit backend "eager" and "native", torch.compile backend "eager", and
     framejit vs torch.compile with backend "inductor" (the third compile of both: the first
     step's input is a view of the prompt's output, with another stride than later steps').
  7. Distributed: DDP on 2 ranks (processes, gloo, one thread each), an MLP of 8
     Linear(512, 512) blocks with 2 MB buckets, batch 64, AdamW: steps/s over 20 steps after 3,
     eager DDP vs framejit (backend eager; backend aot_eager with the bucket split on and off)
     vs torch.compile (aot_eager, DDPOptimizer on and off).
"""
import argparse
import copy
import ctypes
import dataclasses
import datetime
import gc
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import timeit
import tracemalloc
import warnings
import weakref

import torch
import torch._dynamo
import torch.nn as nn

import framejit
import framejit.testing  # noqa: E402  (CompileCounter for the new-shapes counts)

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# 3.11, the first supported version, writes benchmarks/results/; every other version a folder of
# its own beside it (benchmarks/results/py312/), so the versions' tables sit side by side.
RESULTS_DIR = os.path.join(REPO_ROOT, "benchmarks", "results",
                           *([] if sys.version_info[:2] == (3, 11) else
                             ["py%d%d" % sys.version_info[:2]]))
COMPILERS = ("framejit", "dynamo")

# One cycle of the straight-line chain: (source line, tensor ops it records).
CHAIN_CYCLE = (
    ("x = x * 1.0001 + 0.5", 2),
    ("x = torch.sin(x)", 1),
    ("x = x - 0.25", 1),
    ("x = torch.relu(x)", 1),
)

GOALS = {
    "trace_speedup": 50.0,          # Dynamo µs/op divided by framejit µs/op, at least
    "tiny_vs_eager": 1.3,           # framejit tiny-function call / eager call, at most
    "tiny_vs_dynamo": 0.3,          # framejit / Dynamo, at most
    "precomputed_us": 5.0,          # framejit 100-param module, precomputed backend, µs at most
    "precomputed_vs_dynamo": 0.3,   # framejit / Dynamo, at most
    "native_speedup": 1.5,          # eager µs / native µs on (a) and (b), at least
    "native_compute_bound": 1.05,   # native µs / eager µs on (c), at most
    "hf_first_call_speedup": 20.0,  # torch.compile first call / framejit first call, at least
    "hf_cached_vs_dynamo": 1.0,     # framejit cached call / torch.compile cached call, at most
    "dynamic_total_vs_dynamo": 0.5,  # framejit / torch.compile wall time, 16 calls, 8 sizes
}
SECTIONS = ("trace", "calls", "memory", "backends", "transformers", "dynamic", "positions",
            "distributed")


# --------------------------------------------------------------------------------------------
# Helpers shared by the sections
# --------------------------------------------------------------------------------------------

def compile_with(compiler, fn, backend):
    """fn (a function or nn.Module) compiled by "framejit" or "dynamo" with the given backend."""
    if compiler == "framejit":
        return framejit.compile(fn, backend=backend)
    return torch.compile(fn, backend=backend)


def reset_compilers():
    framejit.reset()
    torch._dynamo.reset()
    gc.collect()


def make_function(source, name="f"):
    """Define a function from source text; each call gives a new, distinct code object."""
    namespace = {"torch": torch}
    exec(compile(source, f"<bench {name}>", "exec"), namespace)
    return namespace[name]


def chain_source(n_ops):
    """A straight-line function of exactly n_ops tensor ops, cycling through CHAIN_CYCLE."""
    lines, ops, i = [], 0, 0
    while ops < n_ops:
        line, cost = CHAIN_CYCLE[i % len(CHAIN_CYCLE)]
        if ops + cost > n_ops:
            line, cost = "x = torch.sin(x)", 1
        lines.append(f"    {line}\n")
        ops, i = ops + cost, i + 1
    return "def f(x):\n" + "".join(lines) + "    return x\n"


def loop_source(n_iters):
    return ("def f(x):\n"
            f"    for i in range({n_iters}):\n"
            "        x = torch.sin(x) + 1\n"
            "    return x\n")


def count_ops(graph_modules):
    return sum(1 for gm in graph_modules for node in gm.graph.nodes if node.op.startswith("call"))


class PassThroughBackend:
    """Records the graphs it is given and runs them as they are (gm.forward)."""

    def __init__(self):
        self.graphs = []
        self.__name__ = "pass_through"

    def __call__(self, gm, example_inputs):
        self.graphs.append(gm)
        return gm.forward


def precomputed_backend(gm, example_inputs):
    """Runs the graph once at compile time; its callable returns those outputs every call."""
    outputs = gm.forward(*example_inputs)
    return lambda *args: outputs


def same_result(actual, expected):
    try:
        return bool(torch.allclose(actual, expected, equal_nan=True))
    except Exception:  # noqa: BLE001  (a wrong type or shape is a mismatch)
        return False


def markdown_table(headers, rows):
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def fmt(value, digits=3):
    """Numbers for tables: '-' for missing, 3 significant digits otherwise."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}g}" if abs(value) < 10 ** digits else f"{value:.0f}"
    return str(value)


def ratio(numerator, denominator):
    if numerator is None or denominator is None or denominator == 0:
        return None
    return numerator / denominator


# --------------------------------------------------------------------------------------------
# Section 1: front-end trace + compile time
# --------------------------------------------------------------------------------------------

@dataclasses.dataclass
class TraceResult:
    compiler: str
    case: str
    size: int
    seconds: float = None      # first call minus eager call
    ops: int = None            # call nodes in the graphs handed to the backend
    graphs: int = None
    correct: bool = None
    note: str = ""

    @property
    def us_per_op(self):
        return self.seconds / self.ops * 1e6 if self.seconds is not None and self.ops else None


def trace_source(case, size):
    return chain_source(size) if case == "chain" else loop_source(size)


def trace_target(case, size):
    """(what to compile, its arguments): a generated function on an 8-element tensor, or, for
    case "zoo:<name>", that zoo model (seeded, eval mode) on its example inputs of batch `size`."""
    if case.startswith("zoo:"):
        cls = load_zoo().ZOO[case[4:]]
        torch.manual_seed(0)
        return cls().eval(), cls.example(size)
    return make_function(trace_source(case, size)), (torch.randn(8),)


def same_tree(actual, expected):
    leaves = torch.utils._pytree.tree_leaves
    a, e = leaves(actual), leaves(expected)
    return len(a) == len(e) and all(
        torch.allclose(x, y, rtol=1e-4, atol=1e-5) if isinstance(x, torch.Tensor) else x == y
        for x, y in zip(a, e))


def warm_up_trace(compiler):
    """First compiles pay one-off imports and caches; pay them outside the measurement."""
    x = torch.randn(8)
    for case in ("chain", "loop"):
        compile_with(compiler, make_function(trace_source(case, 10)), PassThroughBackend())(x)
    reset_compilers()


def timed(fn, args):
    start = time.perf_counter()
    fn(*args)
    return time.perf_counter() - start


def measure_trace(compiler, case, size, repeats):
    """Best of `repeats` fresh compiles of a freshly generated function."""
    result = TraceResult(compiler, case, size)
    for _ in range(repeats):
        fn, args = trace_target(case, size)
        expected = fn(*args)
        backend = PassThroughBackend()
        compiled = compile_with(compiler, fn, backend)
        reset_compilers()
        start = time.perf_counter()
        actual = compiled(*args)
        first_s = time.perf_counter() - start
        # The first call also ran the graph once: subtract what a cached call of the same
        # compiled function takes (best of five). Subtracting one eager run was too noisy: it
        # made a small model's compile time negative.
        run_s = min(timed(compiled, args) for _ in range(5))
        seconds = first_s - run_s
        if result.seconds is None or seconds < result.seconds:
            result.seconds = seconds
        result.ops, result.graphs = count_ops(backend.graphs), len(backend.graphs)
        result.correct = same_tree(actual, expected)
        del compiled, backend
        reset_compilers()
    return result


def measure_trace_in_child(compiler, case, size, cap_s):
    """measure_trace in a fresh interpreter, killed after cap_s seconds."""
    command = [sys.executable, os.path.abspath(__file__), "--child-trace", compiler, case, str(size)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=cap_s)
    except subprocess.TimeoutExpired:
        return TraceResult(compiler, case, size, note=f"not finished within the {cap_s:.0f} s cap")
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return TraceResult(compiler, case, size, note=f"child failed (rc {done.returncode}): {tail}")
    return TraceResult(**json.loads(done.stdout.strip().splitlines()[-1]))


def child_trace(compiler, case, size):
    """Entry point of the child process: one measurement, printed as JSON."""
    warm_up_trace(compiler)
    result = measure_trace(compiler, case, int(size), repeats=1)
    result.note = "separate process"
    print(json.dumps(dataclasses.asdict(result)))


def run_trace_section(args):
    chain_sizes = [100, 1000] if args.quick else [100, 1000, 5000]
    cases = [("chain", n) for n in chain_sizes] + [("loop", 100), ("loop", 1000)]
    cases += [(f"zoo:{name}", ZOO_BATCH) for name in load_zoo().ZOO]
    repeats = 1 if args.quick else 3
    for compiler in COMPILERS:
        warm_up_trace(compiler)
    results = []
    for case, size in cases:
        for compiler in COMPILERS:
            print(f"  trace {case} {size} with {compiler} ...", flush=True)
            if size >= 5000:
                result = measure_trace_in_child(compiler, case, size, args.cap)
            else:
                result = measure_trace(compiler, case, size, repeats)
            results.append(result)
    return results


def trace_table(results):
    by_key = {(r.case, r.size, r.compiler): r for r in results}
    rows = []
    for case, size in dict.fromkeys((r.case, r.size) for r in results):
        fj, dyn = by_key[(case, size, "framejit")], by_key[(case, size, "dynamo")]
        label = (f"chain of {size:,} ops" if case == "chain" else
                 f"zoo {case[4:]}, batch {size}" if case.startswith("zoo:") else
                 f"loop range({size:,}), sin+add")
        rows.append([
            label,
            f"{fmt(fj.ops)} / {fmt(dyn.ops)}",
            f"{fmt(fj.graphs)} / {fmt(dyn.graphs)}",
            fmt(fj.seconds), fmt(dyn.seconds),
            fmt(fj.us_per_op), fmt(dyn.us_per_op),
            fmt(ratio(dyn.us_per_op, fj.us_per_op)),
            f"{correctness(fj)} / {correctness(dyn)}",
        ])
    headers = ["case", "ops captured (fj / Dynamo)", "graphs (fj / Dynamo)", "framejit s",
               "Dynamo s", "framejit µs/op", "Dynamo µs/op", "Dynamo / framejit",
               "result matches eager (fj / Dynamo)"]
    notes = [f"- {r.compiler}, {r.case} {r.size:,}: {r.note}" for r in results if r.note]
    return markdown_table(headers, rows) + ("\n\n" + "\n".join(notes) if notes else "")


def correctness(result):
    return {True: "yes", False: "**NO**", None: "-"}[result.correct]


# --------------------------------------------------------------------------------------------
# Section 2: per-call overhead
# --------------------------------------------------------------------------------------------

def tiny_function(x):
    return x + 1


def many_regions_function(n_regions=64):
    """A function of n_regions regions: n_regions - 1 branches on a tensor's value, each a graph
    break the runtime performs, so every call looks a region up at each of n_regions pcs."""
    body = "".join("    if x.sum() > -1e9:\n        x = x * 1.0\n" for _ in range(n_regions - 1))
    return make_function("def f(x):\n" + body + "    return x + 1\n")


def make_param_module(n_params=100, size=4):
    """A module whose forward uses its n_params Parameters directly, in one straight line:
    x = x * self.p0 + self.p1; x = x * self.p2 + self.p3; ..."""
    body = "".join(f"    x = x * self.p{i} + self.p{i + 1}\n" for i in range(0, n_params, 2))
    forward = make_function("def forward(self, x):\n" + body + "    return x\n", "forward")
    module = type("HundredParams", (nn.Module,), {"forward": forward})()
    for i in range(n_params):
        init = torch.rand(size) * 0.01 + (1.0 if i % 2 == 0 else 0.0)
        setattr(module, f"p{i}", nn.Parameter(init))
    return module


def interleaved_us_per_call(callables, arg, repeats, unpack=False):
    """µs per call of each callable: min over `repeats` short rounds (~20 ms each), candidates
    interleaved, so that load from other processes hits them alike and quiet moments are
    caught by every candidate; the order rotates each round, so that no candidate always runs
    right after the same other one. unpack: `arg` is a tuple of arguments (fn(*arg))."""
    statement = "fn(*x)" if unpack else "fn(x)"
    timers = {name: timeit.Timer(statement, globals={"fn": fn, "x": arg})
              for name, fn in callables.items()}
    numbers = {name: max(1, timer.autorange()[0] // 10) for name, timer in timers.items()}
    best = {name: float("inf") for name in timers}
    names = list(timers)
    for i in range(repeats):
        for name in names[i % len(names):] + names[:i % len(names)]:
            best[name] = min(best[name], timers[name].timeit(numbers[name]) / numbers[name] * 1e6)
    return best


@dataclasses.dataclass
class CallResult:
    case: str
    eager_us: float
    framejit_us: float
    dynamo_us: float
    correct: dict

    @property
    def framejit_vs_eager(self):
        return ratio(self.framejit_us, self.eager_us)

    @property
    def framejit_vs_dynamo(self):
        return ratio(self.framejit_us, self.dynamo_us)

    @property
    def dynamo_vs_eager(self):
        return ratio(self.dynamo_us, self.eager_us)


def measure_calls(case, fn, arg, backend, repeats):
    reset_compilers()
    expected = fn(arg)
    callables, correct = {"eager": fn}, {}
    for compiler in COMPILERS:
        compiled = compile_with(compiler, fn, backend)
        correct[compiler] = same_result(compiled(arg), expected)
        compiled(arg)  # the cached path from here on
        callables[compiler] = compiled
    us = interleaved_us_per_call(callables, arg, repeats)
    reset_compilers()
    return CallResult(case, us["eager"], us["framejit"], us["dynamo"], correct)


def run_call_section(args):
    repeats = 20 if args.quick else 60
    module = make_param_module()
    results = []
    with torch.no_grad():
        print("  per-call: tiny function ...", flush=True)
        results.append(measure_calls("tiny `x + 1`, 1-element tensor, backend eager",
                                     tiny_function, torch.randn(1), "eager", repeats))
        print("  per-call: 100-parameter module ...", flush=True)
        results.append(measure_calls("100-Parameter module, backend eager",
                                     module, torch.randn(4), "eager", repeats))
        print("  per-call: 100-parameter module, precomputed-output backend ...", flush=True)
        results.append(measure_calls("100-Parameter module, precomputed-output backend",
                                     module, torch.randn(4), precomputed_backend, repeats))
        print("  per-call: 64 regions ...", flush=True)
        results.append(measure_calls("64 regions in one frame (63 branches on a tensor), "
                                     "backend eager", many_regions_function(), torch.randn(4),
                                     "eager", repeats))
    return results


def call_table(results):
    rows = [[r.case, fmt(r.eager_us), fmt(r.framejit_us), fmt(r.dynamo_us),
             fmt(r.framejit_vs_eager), fmt(r.framejit_vs_dynamo), fmt(r.dynamo_vs_eager),
             " / ".join("yes" if r.correct[c] else "**NO**" for c in COMPILERS)]
            for r in results]
    headers = ["case", "eager µs", "framejit µs", "Dynamo µs", "framejit / eager",
               "framejit / Dynamo", "Dynamo / eager", "result matches eager (fj / Dynamo)"]
    note = ("\n\nThe precomputed-output row's eager column is the module run eagerly, for scale; "
            "both compilers skip the module's ops there, so it times only their call path.")
    return markdown_table(headers, rows) + note


# --------------------------------------------------------------------------------------------
# Section 3: memory
# --------------------------------------------------------------------------------------------

def rss_bytes():
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def malloc_in_use():
    """Bytes in use in glibc malloc (C++ new, large Python blocks; not pymalloc's arenas)."""
    try:
        mallinfo2 = ctypes.CDLL(None).mallinfo2
    except (AttributeError, OSError):
        return None
    mallinfo2.restype = _MallInfo2
    info = mallinfo2()
    return info.uordblks + info.hblkhd


def per_function(before, after, n):
    return None if before is None or after is None else (after - before) / n


def malloc_and_rss():
    return malloc_in_use(), rss_bytes()


def compile_and_call_many(compiler, n_functions, measure):
    """measure() (a tuple of byte counts) before and after compiling and calling n distinct
    5-op functions, the compiled functions kept alive; the differences per function."""
    x = torch.randn(8)
    compile_with(compiler, make_function(chain_source(5)), "eager")(x)  # warm-up
    functions = [make_function(chain_source(5)) for _ in range(n_functions)]
    gc.collect()
    before = measure()
    compiled = [compile_with(compiler, fn, "eager") for fn in functions]
    for fn in compiled:
        fn(x)
    gc.collect()
    after = measure()
    del compiled
    reset_compilers()
    return [per_function(b, a, n_functions) for b, a in zip(before, after)]


def traced_bytes():
    return (tracemalloc.get_traced_memory()[0],)


def retained_per_function(compiler, n_functions):
    """Bytes retained per compiled function: (tracemalloc, glibc malloc, RSS). malloc and RSS
    are taken in a pass without tracemalloc, whose own bookkeeping would count there."""
    tracemalloc.start()
    traced = compile_and_call_many(compiler, n_functions, traced_bytes)
    tracemalloc.stop()
    return traced + compile_and_call_many(compiler, n_functions, malloc_and_rss)


def input_released(call, make_input):
    tensor = make_input()
    ref = weakref.ref(tensor)
    call(tensor)
    del tensor
    gc.collect()
    return ref() is None


def weakref_checks(compiler):
    """Is each input tensor freed once the call returns? (True is what we want.)"""
    reset_compilers()
    fn = compile_with(compiler, make_function(chain_source(5)), "eager")
    checks = {
        "first call (compiles)": input_released(fn, lambda: torch.randn(8)),
        "cached call": input_released(fn, lambda: torch.randn(8)),
        "new shape (recompiles)": input_released(fn, lambda: torch.randn(3)),
    }
    module = compile_with(compiler, make_param_module(), "eager")
    with torch.no_grad():
        checks["100-param module, first call"] = input_released(module, lambda: torch.randn(4))
        checks["100-param module, cached call"] = input_released(module, lambda: torch.randn(4))
    reset_compilers()
    return checks


def run_memory_section(args):
    n_functions = 20 if args.quick else 100
    memory, released = {}, {}
    for compiler in COMPILERS:
        print(f"  memory: {n_functions} functions with {compiler} ...", flush=True)
        reset_compilers()
        memory[compiler] = retained_per_function(compiler, n_functions)
        released[compiler] = weakref_checks(compiler)
    return {"n_functions": n_functions, "retained": memory, "released": released}


def memory_tables(memory):
    rows = [[compiler] + [fmt(None if b is None else b / 1024) for b in memory["retained"][compiler]]
            for compiler in COMPILERS]
    retained = markdown_table(["compiler", "KiB per function (tracemalloc)",
                               "KiB per function (glibc malloc in use)",
                               "KiB per function (RSS)"], rows)
    checks = list(memory["released"]["framejit"])
    rows = [[check] + ["freed" if memory["released"][c][check] else "**KEPT ALIVE**"
                       for c in COMPILERS] for check in checks]
    released = markdown_table(["input tensor after the call", "framejit", "Dynamo"], rows)
    return (f"Retained after compiling and calling {memory['n_functions']} distinct 5-op "
            "functions (backend eager, compiled functions kept alive). tracemalloc counts "
            "Python's allocators (C++ `new` is invisible to it); glibc's mallinfo2 counts "
            "malloc: C++ `new`, libtorch and Python blocks over 512 bytes, not pymalloc's "
            "mmap'd arenas (so the two overlap and neither is the total); RSS counts "
            "everything but moves in pages. Take the last two as rough figures.\n\n"
            + retained + "\n\nWeakref check: is the input tensor freed after the call returns?"
            "\n\n" + released)


# --------------------------------------------------------------------------------------------
# Section 4: end-to-end forward time per backend
# --------------------------------------------------------------------------------------------

# (key, compiler, backend, label): compiler None is the model called directly (eager).
BACKEND_COLUMNS = (
    ("eager", None, None, "eager"),
    ("framejit_eager", "framejit", "eager", "framejit eager"),
    ("framejit_native", "framejit", "native", "framejit native"),
    ("dynamo_eager", "dynamo", "eager", "torch.compile eager"),
    ("dynamo_inductor", "dynamo", "inductor", "torch.compile inductor"),
)
ZOO_PATH = os.path.join(REPO_ROOT, "tests", "models", "zoo.py")
ZOO_BATCH = 2
COMPUTE_BATCH = 64   # (c): ~12-20 ms per forward on the 2-core development machine
RTOL, ATOL = 1e-4, 1e-5


class LinearNormBlocks(nn.Module):
    """(a) n_blocks blocks of Linear(d, d) + LayerNorm(d) + GELU: many small ops."""

    def __init__(self, n_blocks=8, d=64):
        super().__init__()
        self.blocks = nn.Sequential(*[nn.Sequential(nn.Linear(d, d), nn.LayerNorm(d), nn.GELU())
                                      for _ in range(n_blocks)])

    def forward(self, x):
        return self.blocks(x)


class WideMLP(nn.Module):
    """(c) Linear(1024, 4096) + GELU + Linear(4096, 1024): the matmuls dominate."""

    def __init__(self, d=1024, hidden=4096):
        super().__init__()
        self.up = nn.Linear(d, hidden)
        self.down = nn.Linear(hidden, d)

    def forward(self, x):
        return self.down(torch.nn.functional.gelu(self.up(x)))


def load_zoo():
    """tests/models/zoo.py as a module (tests/ is not a package on the path)."""
    spec = importlib.util.spec_from_file_location("framejit_benchmark_zoo", ZOO_PATH)
    zoo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(zoo)
    return zoo


def backend_cases():
    """(case, goal, model class, inputs factory); goal names the goal the case counts for."""
    zoo = load_zoo()
    cases = [
        ("(a) 8 x [Linear(64,64) + LayerNorm + GELU], batch 1", "native_speedup",
         LinearNormBlocks, lambda: (torch.randn(1, 64),)),
        ("(b) zoo GPTBlock, batch 1", "native_speedup", zoo.GPTBlock,
         lambda: zoo.GPTBlock.example(1)),
        (f"(c) MLP Linear(1024,4096) + GELU + Linear(4096,1024), batch {COMPUTE_BATCH}",
         "native_compute_bound", WideMLP, lambda: (torch.randn(COMPUTE_BATCH, 1024),)),
    ]
    cases += [(f"(d) zoo {name}, batch {ZOO_BATCH}", None, cls,
               lambda cls=cls: cls.example(ZOO_BATCH)) for name, cls in zoo.ZOO.items()]
    return cases


@dataclasses.dataclass
class BackendResult:
    case: str
    goal: str = None     # the GOALS key this case counts for, if any
    us: dict = dataclasses.field(default_factory=dict)       # column -> µs per forward
    correct: dict = dataclasses.field(default_factory=dict)  # column -> output matches eager
    notes: dict = dataclasses.field(default_factory=dict)    # column -> why it failed

    @property
    def eager_vs_native(self):
        return ratio(self.us.get("eager"), self.us.get("framejit_native"))

    @property
    def native_vs_framejit_eager(self):
        return ratio(self.us.get("framejit_native"), self.us.get("framejit_eager"))

    @property
    def native_vs_inductor(self):
        return ratio(self.us.get("framejit_native"), self.us.get("dynamo_inductor"))


def same_outputs(actual, expected):
    """Same structure, every tensor allclose (rtol=1e-4, atol=1e-5), other leaves equal."""
    actual_leaves, actual_spec = torch.utils._pytree.tree_flatten(actual)
    expected_leaves, expected_spec = torch.utils._pytree.tree_flatten(expected)
    if actual_spec != expected_spec:
        return False
    try:
        return all(bool(torch.allclose(a, e, rtol=RTOL, atol=ATOL))
                   if isinstance(e, torch.Tensor) else a == e
                   for a, e in zip(actual_leaves, expected_leaves))
    except Exception:  # noqa: BLE001  (a wrong type, shape or dtype is a mismatch)
        return False


def failure_text(error):
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0][:160] if lines else ''}"


def measure_backends(case, goal, model_class, make_inputs, repeats):
    """Every column on the same model and inputs: compile and warm up (first call compiles),
    check the outputs of both warm-up calls against eager, then time them interleaved."""
    reset_compilers()
    torch.manual_seed(0)
    model = model_class().eval()
    args = make_inputs()
    result = BackendResult(case, goal)
    with torch.no_grad():
        expected = model(*args)
        callables = {"eager": model}
        for key, compiler, backend, _ in BACKEND_COLUMNS[1:]:
            try:
                compiled = compile_with(compiler, model, backend)
                first = compiled(*args)    # compiles
                second = compiled(*args)   # the cached path, as timed
            except Exception as e:  # noqa: BLE001  (a failing compiler is a result)
                result.notes[key] = failure_text(e)
                continue
            result.correct[key] = same_outputs(first, expected) and same_outputs(second, expected)
            callables[key] = compiled
        try:
            result.us = interleaved_us_per_call(callables, args, repeats, unpack=True)
        except Exception:  # noqa: BLE001  (one failed while timing: time them one by one)
            for key, fn in callables.items():
                try:
                    result.us.update(interleaved_us_per_call({key: fn}, args, repeats, True))
                except Exception as e:  # noqa: BLE001
                    result.notes[key] = "while timing: " + failure_text(e)
    del callables, model
    reset_compilers()
    return result


def run_backend_section(args):
    repeats = 20 if args.quick else 60
    results = []
    for case, goal, model_class, make_inputs in backend_cases():
        print(f"  backends: {case} ...", flush=True)
        results.append(measure_backends(case, goal, model_class, make_inputs, repeats))
    return results


def backend_goal(results):
    """(met: True/False/None, text) for the native-backend goal, computed from this run."""
    speedups = [(r.case[:3], r.eager_vs_native) for r in results if r.goal == "native_speedup"]
    compute = [(r.case[:3], ratio(r.us.get("framejit_native"), r.us.get("eager")))
               for r in results if r.goal == "native_compute_bound"]
    if not speedups and not compute:
        return None, "not measured"
    checks = [value is not None and value >= GOALS["native_speedup"] for _, value in speedups]
    checks += [value is not None and value <= GOALS["native_compute_bound"] for _, value in compute]
    parts = [f"{label} eager/native {fmt(value)}" for label, value in speedups]
    parts += [f"{label} native/eager {fmt(value)}" for label, value in compute]
    return all(checks), ", ".join(parts)


def backend_header(results):
    met, detail = backend_goal(results)
    status = {True: "**met**", False: "**not met**", None: "not measured"}[met]
    return (f"Goal: native at least {GOALS['native_speedup']:g}x faster than eager on (a) and "
            f"(b), and at most {(GOALS['native_compute_bound'] - 1) * 100:.0f}% slower than "
            f"eager on (c). In this run: {status} ({detail}).\n\n"
            "µs per forward under torch.no_grad(), models in eval mode, all columns on the same "
            "inputs in one process; each compiled callable called twice before timing (the first "
            "call compiles); min over interleaved timeit rounds of ~20 ms. \"matches eager\": "
            f"both warm-up outputs allclose to eager's (rtol={RTOL:g}, atol={ATOL:g}).\n")


def backend_table(results):
    def us_cell(r, key):
        return "failed" if key in r.notes else fmt(r.us.get(key))

    def match_cell(r, key):
        if key in r.notes and key not in r.correct:
            return "failed"
        return {True: "yes", False: "**NO**", None: "-"}[r.correct.get(key)]

    compiled = BACKEND_COLUMNS[1:]
    rows = [[r.case] + [us_cell(r, key) for key, *_ in BACKEND_COLUMNS]
            + [fmt(r.eager_vs_native), fmt(r.native_vs_framejit_eager), fmt(r.native_vs_inductor),
               " / ".join(match_cell(r, key) for key, *_ in compiled)]
            for r in results]
    headers = (["case"] + [f"{label} µs" for *_, label in BACKEND_COLUMNS]
               + ["eager / native", "native / framejit eager", "native / inductor",
                  "matches eager (" + " / ".join(label for *_, label in compiled) + ")"])
    notes = [f"- {r.case}, {label}: {r.notes[key]}" for r in results
             for key, *_, label in BACKEND_COLUMNS if key in r.notes]
    return markdown_table(headers, rows) + ("\n\n" + "\n".join(notes) if notes else "")


# --------------------------------------------------------------------------------------------
# Goals, report, plot
# --------------------------------------------------------------------------------------------

# --------------------------------------------------------------------------------------------
# Section 5: transformers
# --------------------------------------------------------------------------------------------

HF_CANDIDATES = (("framejit", "eager"), ("framejit", "native"), ("dynamo", "eager"))


def hf_models():
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import transformers as hf
    small = dict(num_hidden_layers=2, hidden_size=64, intermediate_size=128,
                 num_attention_heads=4, vocab_size=1000, max_position_embeddings=128)
    return {
        "GPT2LMHeadModel": lambda: hf.GPT2LMHeadModel(hf.GPT2Config(
            n_layer=2, n_embd=64, n_head=4, vocab_size=1000, n_positions=128)),
        "LlamaForCausalLM": lambda: hf.LlamaForCausalLM(hf.LlamaConfig(num_key_value_heads=2, **small)),
        "BertForSequenceClassification": lambda: hf.BertForSequenceClassification(hf.BertConfig(**small)),
    }


def graphs_compiled(compiler, model, ids):
    """How many graphs one call of the model hands to the backend (a counting backend that
    runs them as they are)."""
    reset_compilers()
    seen = []

    def counting(gm, example_inputs):
        seen.append(gm)
        return gm.forward
    compile_with(compiler, model, counting)(ids)
    reset_compilers()
    return len(seen)


def run_transformers_section(args):
    if importlib.util.find_spec("transformers") is None:
        print("  transformers is not installed: section skipped", flush=True)
        return []
    repeats = 10 if args.quick else 30
    results = []
    for name, make in hf_models().items():
        print(f"  transformers: {name} ...", flush=True)
        torch.manual_seed(0)
        model = make().eval()
        ids = torch.randint(0, 1000, (2, 16))
        with torch.no_grad():
            expected = model(ids)[0]
            eager_s = min(timed(model, (ids,)) for _ in range(3))
            row = {"case": name, "first_ms": {}, "us": {}, "correct": {},
                   "graphs": {c: graphs_compiled(c, model, ids) for c in COMPILERS}}
            callables = {"eager": lambda x: model(x)}
            for compiler, backend in HF_CANDIDATES:
                reset_compilers()
                key = f"{compiler}_{backend}"
                compiled = compile_with(compiler, model, backend)
                start = time.perf_counter()
                out = compiled(ids)[0]
                row["first_ms"][key] = max(0.0, time.perf_counter() - start - eager_s) * 1e3
                row["correct"][key] = bool(torch.allclose(out, expected, rtol=1e-4, atol=1e-5))
                compiled(ids)  # the cached path from here on
                callables[key] = (lambda c: lambda x: c(x))(compiled)
            row["us"] = interleaved_us_per_call(callables, ids, repeats)
            row["shapes"] = new_shapes(model, ids)
        row["train"] = train_steps(make, name, ids, 3 if args.quick else 6)
        if not name.startswith("Bert"):  # the decoders with activation checkpointing on
            row["train_checkpointed"] = train_steps(make, name, ids, 3 if args.quick else 6,
                                                    checkpointing=True)
        results.append(row)
        reset_compilers()
    return results


HF_NEW_SHAPES = ((2, 17), (3, 16), (2, 20), (4, 24), (1, 9), (2, 30), (5, 11), (3, 40))


def new_shapes(model, ids):
    """After a first call on `ids`: 8 calls on new (batch, length) shapes, each compared with
    eager. Per candidate: graphs compiled for them and the wall time of the 8 calls (compiles
    included), beside eager's."""
    calls = [torch.randint(0, 1000, shape) for shape in HF_NEW_SHAPES]
    expected = [model(x)[0] for x in calls]
    out = {"eager_ms": 1e3 * sum(timed(model, (x,)) for x in calls), "compiles": {}, "ms": {},
           "correct": {}}
    for compiler, backend in HF_CANDIDATES:
        reset_compilers()
        key = f"{compiler}_{backend}"
        counter = framejit.testing.CompileCounter(None if backend == "eager" else backend)
        compiled = compile_with(compiler, model, counter)
        compiled(ids)
        before = counter.frame_count
        start = time.perf_counter()
        results = [compiled(x)[0] for x in calls]
        out["ms"][key] = 1e3 * (time.perf_counter() - start)
        out["compiles"][key] = counter.frame_count - before
        out["correct"][key] = all(torch.allclose(a, b, rtol=1e-4, atol=1e-5)
                                  for a, b in zip(results, expected))
    reset_compilers()
    return out


TRAIN_CANDIDATES = (("framejit", "eager"), ("framejit", "native"), ("dynamo", "eager"))


def train_steps(make, name, ids, steps, checkpointing=False):
    """A training step (forward with labels, backward, AdamW step, zero_grad) compiled whole:
    the first step's time (its compiles included) and the median of the next `steps`, for eager
    and each candidate, from the same seeded model; the parameters after them compared with
    eager's. checkpointing: transformers' activation checkpointing on (each decoder layer
    through torch.utils.checkpoint, use_reentrant=False)."""
    labels = torch.tensor([0, 1]) if name.startswith("Bert") else ids
    out = {"first_ms": {}, "step_ms": {}, "correct": {}}
    finals = {}
    for compiler, backend in (("eager", None),) + TRAIN_CANDIDATES:
        key = "eager" if backend is None else f"{compiler}_{backend}"
        reset_compilers()
        torch.manual_seed(0)
        model = make().train()
        if checkpointing:
            model.gradient_checkpointing_enable()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

        def step(x, y, model=model, opt=opt):
            loss = model(x, labels=y).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss
        run = step if backend is None else compile_with(compiler, step, backend)
        start = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # transformers: use_cache off under checkpointing
            run(ids, labels)
        out["first_ms"][key] = (time.perf_counter() - start) * 1e3
        times = []
        for _ in range(steps):
            start = time.perf_counter()
            run(ids, labels)
            times.append(time.perf_counter() - start)
        out["step_ms"][key] = statistics.median(times) * 1e3
        finals[key] = [p.detach().clone() for p in model.parameters()]
    for key in finals:
        out["correct"][key] = all(torch.allclose(a, b, rtol=1e-4, atol=1e-5)
                                  for a, b in zip(finals[key], finals["eager"]))
    reset_compilers()
    return out


def transformers_table(results):
    if not results:
        return "Not measured: transformers is not installed."
    keys = [f"{c}_{b}" for c, b in HF_CANDIDATES]
    names = {"framejit_eager": "framejit eager", "framejit_native": "framejit native",
             "dynamo_eager": "torch.compile eager"}
    rows = []
    for r in results:
        rows.append([r["case"], "first call ms", "—"] + [fmt(r["first_ms"][k]) for k in keys] +
                    [fmt(ratio(r["first_ms"]["dynamo_eager"], r["first_ms"]["framejit_eager"]))])
        rows.append(["", "cached µs", fmt(r["us"]["eager"])] + [fmt(r["us"][k]) for k in keys] +
                    [fmt(ratio(r["us"]["framejit_eager"], r["us"]["dynamo_eager"]))])
        rows.append(["", "graphs / matches eager", "—"] +
                    [f"{r['graphs'][k.split('_')[0]]} / {'yes' if r['correct'][k] else '**NO**'}"
                     for k in keys] + [""])
        shapes = r.get("shapes")
        if shapes:
            rows.append(["", f"{len(HF_NEW_SHAPES)} new shapes: compiles / ms",
                         fmt(shapes["eager_ms"])] +
                        [f"{shapes['compiles'][k]} / {fmt(shapes['ms'][k])}"
                         + ("" if shapes["correct"][k] else " **NO**") for k in keys] +
                        [fmt(ratio(shapes["ms"]["framejit_eager"], shapes["ms"]["dynamo_eager"]))])
        for field, label in (("train", "train step (AdamW)"),
                             ("train_checkpointed", "train step, checkpointed layers")):
            train = r.get(field)
            if not train:
                continue
            tk = [f"{c}_{b}" for c, b in TRAIN_CANDIDATES]
            cells = {k: "—" for k in keys}
            for k in tk:
                cells[k] = fmt(train["first_ms"][k]) + ("" if train["correct"][k] else " **NO**")
            rows.append(["", f"{label}: first ms", fmt(train["first_ms"]["eager"])] +
                        [cells[k] for k in keys] +
                        [fmt(ratio(train["first_ms"]["dynamo_eager"], train["first_ms"]["framejit_eager"]))])
            for k in tk:
                cells[k] = fmt(train["step_ms"][k])
            rows.append(["", f"{label}: ms", fmt(train["step_ms"]["eager"])] +
                        [cells[k] for k in keys] +
                        [fmt(ratio(train["step_ms"]["framejit_eager"], train["step_ms"]["dynamo_eager"]))])
    headers = (["model", "measure", "eager"] + [names[k] for k in keys] +
               ["torch.compile / framejit (first), framejit / torch.compile (cached, new shapes)"])
    return markdown_table(headers, rows)


# --------------------------------------------------------------------------------------------
# Section 6: dynamic shapes through inductor
# --------------------------------------------------------------------------------------------

DYNAMIC_BATCHES = (2, 5, 7, 11, 16, 3, 9, 13)
DYNAMIC_COMPILERS = ("framejit", "dynamo", "framejit_dynamic")
DYNAMIC_ORDER = (0, 1, 2, 0, 3, 4, 1, 5, 6, 2, 7, 3, 5, 4, 6, 7)  # each size twice


def dynamic_step(x, w):
    h = torch.nn.functional.gelu(x @ w) * 2
    return h.view(x.size(0), -1).softmax(-1).sum(1)


def dynamic_cases(quick):
    sys.path.insert(0, os.path.join(REPO_ROOT, "tests"))
    from models.zoo import ZOO
    return ["function"] + [f"zoo {name}" for name in (["mlp", "gpt_block"] if quick else sorted(ZOO))]


def child_dynamic(compiler, case):
    """One (compiler, case) of section 6, in a child with its own inductor cache: prints JSON.
    compiler "framejit_dynamic" is framejit with dynamic=True."""
    from torch._inductor.cpu_vec_isa import pick_vec_isa
    start = time.perf_counter()
    pick_vec_isa()  # the per-machine probe (see the module docstring): outside the totals
    probe_s = time.perf_counter() - start
    from framejit.testing import same
    sys.path.insert(0, os.path.join(REPO_ROOT, "tests"))
    from models.zoo import ZOO, run_seeded
    torch.manual_seed(0)
    if case == "function":
        w = torch.randn(32, 16)
        target, make, call = dynamic_step, (lambda b: (torch.randn(b, 32), w)), None
    else:
        name = case[4:]
        target, make, call = ZOO[name]().eval(), ZOO[name].example, run_seeded
    call = call or (lambda fn, inputs: fn(*inputs))
    inputs = [make(DYNAMIC_BATCHES[i]) for i in DYNAMIC_ORDER]
    seen = []
    inside = []  # seconds spent in the backend call: importing and running inductor's compile_fx

    def counting(gm, example_inputs):
        begin = time.perf_counter()
        from torch._inductor.compile_fx import compile_fx
        seen.append(gm)
        try:
            return compile_fx(gm, example_inputs)
        finally:
            inside.append(time.perf_counter() - begin)
    with torch.no_grad():
        expected = [call(target, x) for x in inputs]
        compiled = (framejit.compile(target, backend=counting, dynamic=True)
                    if compiler == "framejit_dynamic" else compile_with(compiler, target, counting))
        start = time.perf_counter()
        outs = [call(compiled, x) for x in inputs]
        total = time.perf_counter() - start
    correct = all(same(o, e, rtol=1e-4, atol=1e-5) for o, e in zip(outs, expected))
    print(json.dumps({"total_s": total, "graphs": len(seen), "correct": correct,
                      "probe_s": probe_s, "backend_s": sum(inside)}))


def run_dynamic_section(args):
    import tempfile
    results = []
    for case in dynamic_cases(args.quick):
        print(f"  dynamic: {case} ...", flush=True)
        row = {"case": case, "total_s": {}, "graphs": {}, "correct": {}, "probe_s": {},
               "backend_s": {}}
        for compiler in DYNAMIC_COMPILERS:
            with tempfile.TemporaryDirectory() as cache:
                env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache,
                           TORCHINDUCTOR_FX_GRAPH_CACHE="0")
                proc = subprocess.run([sys.executable, os.path.abspath(__file__),
                                       "--child-dynamic", compiler, case],
                                      capture_output=True, text=True, env=env, timeout=900)
            try:
                out = json.loads(proc.stdout.strip().splitlines()[-1])
            except (ValueError, IndexError):
                print(proc.stderr[-2000:], flush=True)
                out = {"total_s": None, "graphs": None, "correct": False, "probe_s": None,
                       "backend_s": None}
            for key in ("total_s", "graphs", "correct", "probe_s", "backend_s"):
                row[key][compiler] = out[key]
        results.append(row)
    return results


def dynamic_table(results):
    rows = []
    for r in results:
        compilers = [c for c in DYNAMIC_COMPILERS if c in r["total_s"]]
        probes = [p for p in (r.get("probe_s") or {}).values() if p is not None]
        rows.append([r["case"]] + [fmt(r["total_s"][c]) for c in compilers] +
                    [f"{r['graphs'][c]} / {'yes' if r['correct'][c] else '**NO**'}"
                     for c in compilers] +
                    [fmt(ratio(r["total_s"][c], r["total_s"]["dynamo"]))
                     for c in compilers if c != "dynamo"] +
                    [outside_backend(r, c) for c in compilers] +
                    [fmt(statistics.median(probes)) if probes else "—"])
    names = {"framejit": "framejit", "dynamo": "torch.compile",
             "framejit_dynamic": "framejit dynamic=True"}
    compilers = [c for c in DYNAMIC_COMPILERS
                 if results and c in results[0]["total_s"]] or list(COMPILERS)
    return markdown_table(["case"] + [f"{names[c]} s" for c in compilers] +
                          [f"{names[c]} graphs / matches" for c in compilers] +
                          [f"{names[c]} / torch.compile" for c in compilers if c != "dynamo"] +
                          [f"{names[c]}: s in inductor / s outside" for c in compilers] +
                          ["ISA probe s (not in the totals)"], rows)


def outside_backend(row, compiler):
    """Section 6: the seconds of a total spent inside the backend (importing and running
    inductor's compile_fx) and outside it (the front end's tracing and guards, and the calls)."""
    inside = (row.get("backend_s") or {}).get(compiler)
    total = row["total_s"].get(compiler)
    if inside is None or total is None:
        return "—"
    return f"{fmt(inside)} / {fmt(total - inside)}"


class PositionDecoder(torch.nn.Module):
    """One attention layer with a KV cache written and read at an int position, as Meta's
    reference Llama's forward(tokens, start_pos) does."""

    def __init__(self, dim=64, max_len=64):
        super().__init__()
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.out = torch.nn.Linear(dim, dim)
        self.register_buffer("freqs", torch.randn(max_len, dim))
        self.register_buffer("cache_k", torch.zeros(1, max_len, dim))
        self.register_buffer("cache_v", torch.zeros(1, max_len, dim))

    def forward(self, x, start_pos: int):
        seqlen = x.shape[1]
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        rot = self.freqs[start_pos: start_pos + seqlen]
        q, k = q * rot, k * rot
        self.cache_k[:, start_pos: start_pos + seqlen] = k
        self.cache_v[:, start_pos: start_pos + seqlen] = v
        keys = self.cache_k[:, : start_pos + seqlen]
        values = self.cache_v[:, : start_pos + seqlen]
        scores = q @ keys.transpose(1, 2) / 8.0
        if seqlen > 1:
            mask = torch.triu(torch.full((seqlen, seqlen), float("-inf")), diagonal=1)
            scores = scores + torch.hstack([torch.zeros((seqlen, start_pos)), mask])
        return self.out(scores.softmax(-1) @ values)


POSITION_RUNS = [("eager", None, None), ("framejit eager", "framejit", "eager"),
                 ("framejit native", "framejit", "native"), ("torch.compile eager", "dynamo", "eager"),
                 ("framejit inductor", "framejit", "inductor"),
                 ("torch.compile inductor", "dynamo", "inductor")]


def decode_positions(model, prompt, steps):
    """A prompt at position 0, then `steps` one-token steps at positions len(prompt), ...:
    the outputs, in order."""
    outs = [model(prompt, 0)]
    for pos in range(prompt.shape[1], prompt.shape[1] + steps):
        outs.append(model(outs[-1][:, -1:], pos))
    return outs


def position_run(label, compiler, backend, steps):
    """One row of section 6b: the decoding loop through `compiler` ("framejit", "dynamo" or None:
    eager) with `backend`; total ms (compiles included), graphs, whether it matches eager."""
    import torch._dynamo.testing
    from framejit.testing import same
    torch.manual_seed(0)
    reference_model = PositionDecoder().eval()
    prompt = torch.randn(1, 8, 64)
    with torch.no_grad():
        expected = decode_positions(copy.deepcopy(reference_model), prompt, steps)
        reset_compilers()
        model = copy.deepcopy(reference_model)
        # (framejit's counter keeps its backend's shape-generic mark)
        counter = (framejit.testing.CompileCounter(backend) if compiler == "framejit"
                   else torch._dynamo.testing.CompileCounterWithBackend(backend))
        target = model if compiler is None else compile_with(compiler, model, counter)
        start = time.perf_counter()
        outs = decode_positions(target, prompt, steps)
        total = time.perf_counter() - start
    return {"case": label, "steps": steps + 1, "total_ms": total * 1e3,
            "graphs": None if compiler is None else counter.frame_count,
            "correct": all(same(o, e, rtol=1e-4, atol=1e-5) for o, e in zip(outs, expected))}


def child_positions(label, steps):
    """An inductor row of section 6b in a child with its own inductor cache (as section 6: in
    one process the second compiler would find the first's kernels), after inductor's CPU
    probe, which is outside the total: prints JSON."""
    from torch._inductor.cpu_vec_isa import pick_vec_isa
    pick_vec_isa()
    _, compiler, backend = next(run for run in POSITION_RUNS if run[0] == label)
    print(json.dumps(position_run(label, compiler, backend, int(steps))))


def run_positions_section(args):
    import tempfile
    steps = 16 if args.quick else 48
    results = []
    for label, compiler, backend in POSITION_RUNS:
        if backend != "inductor":
            results.append(position_run(label, compiler, backend, steps))
            continue
        with tempfile.TemporaryDirectory() as cache:
            env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache, TORCHINDUCTOR_FX_GRAPH_CACHE="0")
            proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--child-positions",
                                   label, str(steps)],
                                  capture_output=True, text=True, env=env, timeout=900)
        try:
            results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        except (ValueError, IndexError):
            print(proc.stderr[-2000:], flush=True)
            results.append({"case": label, "steps": steps + 1, "total_ms": None, "graphs": None,
                            "correct": False})
    return results


def positions_table(results):
    eager = next((r["total_ms"] for r in results if r["case"] == "eager"), None)
    rows = [[r["case"], str(r["steps"]), fmt(r["total_ms"]), fmt(ratio(r["total_ms"], eager)),
             "—" if r["graphs"] is None else str(r["graphs"]), "yes" if r["correct"] else "**NO**"]
            for r in results]
    return markdown_table(["run", "calls", "total ms (compiles included)", "vs eager", "graphs",
                           "matches eager"], rows)


DISTRIBUTED_RUNS = [  # (row label, worker scenario)
    ("eager DDP", "eager"),
    ("framejit, backend eager", "framejit_eager"),
    ("framejit, aot_eager, split at buckets", "framejit_aot"),
    ("framejit, aot_eager, one graph", "framejit_aot_nosplit"),
    ("torch.compile, aot_eager, DDPOptimizer", "torch_aot"),
    ("torch.compile, aot_eager, one graph", "torch_aot_nosplit"),
]


def run_distributed_section(args):
    import tempfile
    worker = os.path.join(REPO_ROOT, "tests", "python", "distributed_worker.py")
    results = []
    for label, how in DISTRIBUTED_RUNS:
        print(f"  distributed: {label} ...", flush=True)
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "out.json")
            proc = subprocess.run([sys.executable, "-W", "ignore", worker, f"bench:{how}", "2", out],
                                  capture_output=True, text=True, timeout=900)
            try:
                with open(out) as f:
                    steps = json.load(f)["steps_per_s"]
            except (OSError, ValueError, KeyError):
                print(proc.stderr[-2000:], flush=True)
                steps = None
        results.append({"case": label, "steps_per_s": steps})
    return results


def distributed_table(results):
    eager = results[0]["steps_per_s"] if results else None
    rows = [[r["case"], fmt(r["steps_per_s"]), fmt(ratio(r["steps_per_s"], eager))]
            for r in results]
    return markdown_table(["run", "steps/s", "vs eager DDP"], rows)


def goal_rows(results):
    """The goals table over the sections in `results` (section name -> its results)."""
    rows = []
    trace, calls, backends = (results.get(name) for name in ("trace", "calls", "backends"))
    for case, size in dict.fromkeys((r.case, r.size) for r in trace or ()):
        fj, dyn = [next(r for r in trace if (r.case, r.size, r.compiler) == (case, size, c))
                   for c in COMPILERS]
        speedup = ratio(dyn.us_per_op, fj.us_per_op)
        name = f"zoo {case[4:]}" if case.startswith("zoo:") else f"{case} {size:,}"
        rows.append([f"trace {name}: Dynamo/framejit per op ≥ {GOALS['trace_speedup']:g}x",
                     fmt(speedup), verdict(speedup, GOALS["trace_speedup"], at_least=True)])
    if calls:
        tiny, precomputed = calls[0], calls[2]
        for label, value, goal in [
            ("tiny call: framejit / eager", tiny.framejit_vs_eager, "tiny_vs_eager"),
            ("tiny call: framejit / Dynamo", tiny.framejit_vs_dynamo, "tiny_vs_dynamo"),
            ("100-param precomputed: framejit µs", precomputed.framejit_us, "precomputed_us"),
            ("100-param precomputed: framejit / Dynamo", precomputed.framejit_vs_dynamo,
             "precomputed_vs_dynamo"),
        ]:
            rows.append([f"{label} ≤ {GOALS[goal]:g}", fmt(value), verdict(value, GOALS[goal])])
    for r in results.get("transformers") or ():
        first = ratio(r["first_ms"]["dynamo_eager"], r["first_ms"]["framejit_eager"])
        cached = ratio(r["us"]["framejit_eager"], r["us"]["dynamo_eager"])
        rows.append([f"{r['case']}: torch.compile / framejit first call ≥ "
                     f"{GOALS['hf_first_call_speedup']:g}x", fmt(first),
                     verdict(first, GOALS["hf_first_call_speedup"], at_least=True)])
        rows.append([f"{r['case']}: framejit / torch.compile cached call ≤ "
                     f"{GOALS['hf_cached_vs_dynamo']:g}", fmt(cached),
                     verdict(cached, GOALS["hf_cached_vs_dynamo"])])
    for r in results.get("dynamic") or ():
        value = ratio(r["total_s"]["framejit"], r["total_s"]["dynamo"])
        rows.append([f"dynamic {r['case']}: framejit / torch.compile total time ≤ "
                     f"{GOALS['dynamic_total_vs_dynamo']:g}", fmt(value),
                     verdict(value, GOALS["dynamic_total_vs_dynamo"])])
    for r in backends or ():
        if r.goal == "native_speedup":
            value = r.eager_vs_native
            rows.append([f"{r.case[:3]} native: eager / native ≥ {GOALS[r.goal]:g}x", fmt(value),
                         verdict(value, GOALS[r.goal], at_least=True)])
        elif r.goal == "native_compute_bound":
            value = ratio(r.us.get("framejit_native"), r.us.get("eager"))
            rows.append([f"{r.case[:3]} native: native / eager ≤ {GOALS[r.goal]:g}", fmt(value),
                         verdict(value, GOALS[r.goal])])
    return markdown_table(["goal", "now", "status"], rows)


def verdict(value, goal, at_least=False):
    if value is None:
        return "not measured"
    met = value >= goal if at_least else value <= goal
    return "met" if met else "**not met**"


def environment():
    def git(*args):
        try:
            return subprocess.run(["git", *args], capture_output=True, text=True,
                                  cwd=os.path.dirname(RESULTS_DIR)).stdout.strip()
        except OSError:
            return "?"
    dirty = " (working tree has uncommitted changes)" if git("status", "--porcelain") else ""
    return {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "framejit": f"{framejit.__version__}, commit {git('rev-parse', '--short', 'HEAD')}{dirty}",
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, torch threads "
                   f"{torch.get_num_threads()}",
        "framejit _C built": build_time(),
        "load average at start": " ".join(f"{v:.2f}" for v in os.getloadavg()),
    }


def build_time():
    """mtime of the loaded framejit extension: a rebuild during the run is reported."""
    mtime = os.path.getmtime(framejit._C.__file__)
    return datetime.datetime.fromtimestamp(mtime).isoformat(timespec="seconds")


def trace_method(args):
    if args.quick:
        return ("First call minus one eager call, one fresh compile each (--quick: no 5,000-op "
                "chain). µs/op divides by the call nodes of the FX graphs the backend received.\n")
    return ("First call minus one eager call, best of 3 fresh compiles (5,000 ops: one, in a "
            f"child process capped at {args.cap:.0f} s). µs/op divides by the call nodes of the "
            "FX graphs the backend received.\n")


SECTION_TITLES = {
    "trace": "1. Front-end trace + compile time (pass-through backend)",
    "calls": "2. Per-call overhead (cached path, torch.no_grad())",
    "memory": "3. Memory",
    "backends": "4. End-to-end forward time per backend",
    "transformers": "5. transformers models: first call and cached call",
    "dynamic": "6. Dynamic shapes through inductor: 16 calls, 8 batch sizes",
    "positions": "6b. A decoding loop driven by an int position (Meta Llama's start_pos)",
    "distributed": "7. DDP on 2 ranks (gloo, CPU): training steps per second",
}


def section_text(name, data, args):
    """A section's text in results.md; args: the options of the run that measured it."""
    if name == "trace":
        return trace_method(args) + "\n" + trace_table(data)
    if name == "calls":
        return call_table(data)
    if name == "memory":
        return memory_tables(data)
    if name == "transformers":
        return transformers_table(data)
    if name == "dynamic":
        return dynamic_table(data)
    if name == "positions":
        return positions_table(data)
    if name == "distributed":
        return distributed_table(data)
    return backend_header(data) + "\n" + backend_table(data)


def section_json(name, data):
    if name == "trace":
        return [dict(dataclasses.asdict(r), us_per_op=r.us_per_op) for r in data]
    if name == "calls":
        return [dataclasses.asdict(r) for r in data]
    if name == "backends":
        return [dict(dataclasses.asdict(r), eager_vs_native=r.eager_vs_native,
                     native_vs_framejit_eager=r.native_vs_framejit_eager,
                     native_vs_inductor=r.native_vs_inductor) for r in data]
    return data


def section_from_json(name, raw):
    def build(cls, row):
        names = {field.name for field in dataclasses.fields(cls)}
        return cls(**{key: value for key, value in row.items() if key in names})
    cls = {"trace": TraceResult, "calls": CallResult, "backends": BackendResult}.get(name)
    return raw if cls is None else [build(cls, row) for row in raw]


def previous_sections(names):
    """Sections `names` of the last results.json, as (results, runs): a run with --only keeps
    the other sections' tables, marked with the date of the run that measured them."""
    try:
        with open(os.path.join(RESULTS_DIR, "results.json")) as saved:
            old = json.load(saved)
        default_run = {"date": old["env"]["date"], "quick": old.get("quick", False)}
        results, runs = {}, {}
        for name in names:
            if old.get(name) is not None:
                results[name] = section_from_json(name, old[name])
                runs[name] = old.get("section_runs", {}).get(name, default_run)
        return results, runs
    except (OSError, ValueError, KeyError, TypeError):  # no usable earlier results
        return {}, {}


def write_report(args, env, results, runs, elapsed_s, png_note):
    """results: section name -> results; runs: section name -> {"date", "quick"} of the run
    that measured it (this one, or an earlier one when --only skipped the section)."""
    command = ("python3 benchmarks/run.py" + (" --quick" if args.quick else "")
               + (f" --only {' '.join(args.only)}" if args.only else ""))
    sections = [
        "# framejit benchmarks\n",
        f"`{command}` (took {elapsed_s / 60:.1f} min). See benchmarks/README.md for what each "
        "section measures.\n",
        "\n".join(f"- {key}: {value}" for key, value in env.items()),
        "\n## Goals\n", goal_rows(results),
    ]
    earlier = [name for name in results if runs[name]["date"] != env["date"]]
    if earlier:
        sections.append("\nNot rerun by this command (`--only`), so their goal rows come from "
                        "earlier runs (dates in their sections): " + ", ".join(earlier) + ".")
    for name in SECTIONS:
        sections.append(f"\n## {SECTION_TITLES[name]}\n")
        if name not in results:
            sections.append("Not run.")
            continue
        if runs[name]["date"] != env["date"]:
            sections.append(f"(Not rerun: from the run of {runs[name]['date']}"
                            f"{', --quick' if runs[name].get('quick') else ''}.)\n")
        measured_with = argparse.Namespace(quick=runs[name].get("quick", False), cap=args.cap)
        sections.append(section_text(name, results[name], measured_with))
    if png_note:
        sections.append(f"\n{png_note}\n")
    text = "\n".join(sections) + "\n"
    with open(os.path.join(RESULTS_DIR, "results.md"), "w") as out:
        out.write(text)
    raw = {"env": env, "quick": args.quick, "section_runs": runs}
    raw.update({name: section_json(name, data) for name, data in results.items()})
    with open(os.path.join(RESULTS_DIR, "results.json"), "w") as out:
        json.dump(raw, out, indent=1)


def plot(trace, calls):
    """results.png: µs per traced op and µs per call, framejit vs Dynamo (vs eager)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "results.png not written: matplotlib is not installed."
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5))
    cases = list(dict.fromkeys((r.case, r.size) for r in trace))
    labels = [case[4:].replace("_", "\n") if case.startswith("zoo:") else f"{case}\n{size:,}"
              for case, size in cases]
    width = 0.38
    for offset, compiler in ((-width / 2, "framejit"), (width / 2, "dynamo")):
        values = [next(r.us_per_op for r in trace if (r.case, r.size, r.compiler) ==
                       (case, size, compiler)) or 0 for case, size in cases]
        left.bar([i + offset for i in range(len(cases))], values, width, label=compiler)
    left.set_xticks(range(len(cases)))
    left.set_xticklabels(labels, fontsize=8)
    left.set_yscale("log")
    left.set_ylabel("µs per captured op (log)")
    left.set_title("Front end: trace + compile, pass-through backend")
    left.legend()
    width = 0.27
    for offset, (name, attr) in zip((-width, 0, width), (("eager", "eager_us"),
                                                        ("framejit", "framejit_us"),
                                                        ("dynamo", "dynamo_us"))):
        right.bar([i + offset for i in range(len(calls))], [getattr(r, attr) for r in calls],
                  width, label=name)
    right.set_xticks(range(len(calls)))
    labels = ["tiny x+1", "100 params\neager backend", "100 params\nprecomputed", "64 regions"]
    right.set_xticklabels(labels[:len(calls)])
    right.set_yscale("log")
    right.set_ylabel("µs per call (log)")
    right.set_title("Per-call overhead (cached)")
    right.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(RESULTS_DIR, "results.png"), dpi=110)
    plt.close(fig)
    return ""


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes, fewer repeats")
    parser.add_argument("--only", nargs="+", choices=SECTIONS, metavar="SECTION",
                        help=f"run only these sections ({', '.join(SECTIONS)}); the others keep "
                             "their tables from the previous results.json")
    parser.add_argument("--cap", type=float, default=180.0,
                        help="seconds allowed to each 5,000-op trace (full run only)")
    parser.add_argument("--child-trace", nargs=3, metavar=("COMPILER", "CASE", "SIZE"),
                        help=argparse.SUPPRESS)
    parser.add_argument("--child-dynamic", nargs=2, metavar=("COMPILER", "CASE"),
                        help=argparse.SUPPRESS)
    parser.add_argument("--child-positions", nargs=2, metavar=("RUN", "STEPS"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_trace:
        child_trace(*args.child_trace)
        return
    if args.child_dynamic:
        child_dynamic(*args.child_dynamic)
        return
    if args.child_positions:
        child_positions(*args.child_positions)
        return
    os.makedirs(RESULTS_DIR, exist_ok=True)
    started = time.perf_counter()
    env = environment()
    print("\n".join(f"{key}: {value}" for key, value in env.items()), flush=True)

    selected = [name for name in SECTIONS if args.only is None or name in args.only]
    runners = {
        "trace": (run_trace_section, lambda data: trace_table(data)),
        "calls": (run_call_section, call_table),
        "memory": (run_memory_section, memory_tables),
        "backends": (run_backend_section,
                     lambda data: backend_header(data) + "\n" + backend_table(data)),
        "transformers": (run_transformers_section, transformers_table),
        "dynamic": (run_dynamic_section, dynamic_table),
        "positions": (run_positions_section, positions_table),
        "distributed": (run_distributed_section, distributed_table),
    }
    results, runs = {}, {}
    for name in selected:
        run_section, table = runners[name]
        print(f"\n== {SECTION_TITLES[name]} ==", flush=True)
        results[name] = run_section(args)
        runs[name] = {"date": env["date"], "quick": args.quick}
        print(table(results[name]), flush=True)
    if args.only:
        kept, kept_runs = previous_sections([name for name in SECTIONS if name not in selected])
        results.update(kept)
        runs.update(kept_runs)
    print("\n== Goals ==\n" + goal_rows(results), flush=True)

    env["load average at end"] = " ".join(f"{v:.2f}" for v in os.getloadavg())
    if build_time() != env["framejit _C built"]:
        env["WARNING"] = (f"framejit's _C was rebuilt during the run (now {build_time()}); this "
                          "process kept the old build, child processes may have loaded the new one")
        print(env["WARNING"])
    png_note = ""
    if "trace" in results and "calls" in results:
        png_note = plot(results["trace"], results["calls"])
    if png_note:
        print(png_note)
    write_report(args, env, results, runs, time.perf_counter() - started, png_note)
    print(f"\nwrote {RESULTS_DIR}/results.md ({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
