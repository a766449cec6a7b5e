"""Functions with graph breaks, compiled with framejit and checked against eager.

Every function below breaks its trace at least once: a branch on a tensor's value (or on a number
only known at run time), a call framejit performs instead of tracing (``print``, ``logging``,
``.item()``, user functions), or an iteration it cannot unroll. The runtime ends the region
there, performs the instruction itself in the real frame and goes on with the next region.

Each case is a function plus several argument variants chosen so that both sides of every
branch are taken. For each case (``test_graph_break_case``):

1. every variant gives the same outcome compiled as in eager: the returned value
   (``framejit.testing.same``), or the same exception type, message and traceback (function,
   line number and source text of every entry, the last one in particular); the same stdout
   and ``logging`` records; and the same state of the (cloned) arguments afterwards, so
   functions that mutate their inputs are checked fairly;
2. calling again with fresh clones of the same variant (same metadata, same branch outcomes)
   compiles no graph and adds no region, and neither does a second round over all variants;
   the total number of graphs stays within a bound worked out per function (the regions with
   tensor ops over the paths the variants take);
3. ``regions(fn)`` contains the kinds of exit ("branch", "call", "iterate") the function must
   produce.

``test_variants_run_every_line_in_eager`` checks (with ``sys.settrace``) that the variants of
each case run every line of its function, so no branch side goes untested, and the cases of
section G really raise. Separate tests cover ``warm_branches=True``, ``fullgraph=True``, numbers
from ``.item()`` not being specialised, and leaks over 100,000 calls.
"""
import gc
import inspect
import logging
import sys
import traceback
import types
import weakref

import pytest
import torch

import framejit
from framejit.testing import CompileCounter, regions, same

LOG = logging.getLogger("framejit_tests.graph_breaks")


def T(*values, dtype=torch.float32):
    return torch.tensor(values, dtype=dtype)


# =============================================================================================
# A. Branches on tensor values
# =============================================================================================

def if_sum_positive(x):
    y = x * 2
    if y.sum() > 0:
        y = y + 1
    else:
        y = y - 1
    return y * 3


def if_elif_else(x):
    m = x.mean()
    if m > 0.5:
        r = x * 2
    elif m > 0:
        r = x + 1
    elif m > -0.5:
        r = x - 1
    else:
        r = -x
    return r.sum(), r


def nested_ifs(x, y):
    if x.sum() > 0:
        if y.sum() > 0:
            out = x + y
        else:
            out = x - y
    else:
        if (y > 0).any():
            out = y * 2
        else:
            out = -y
    return out * x


def and_or_conditions(x, y):
    if x.sum() > 0 and y.sum() > 0:
        return x * y
    elif x.max() > 1 or y.min() < -1:
        return x + y
    return x - y


def not_conditions(x):
    if not (x > 0).all():
        x = x.abs()
    if not x.sum() > 10:
        x = x * 2
    return x + 1


def bool_of_tensor(x, flag):
    if bool(flag):
        x = x.flip(0)
    positive = bool(x[0] > 0)
    return (x * 2 if positive else x), positive


def ternary_any_all(a, b):
    c = a if (a > 1).any() else b
    d = b * 2 if (b < 0).all() else b + 1
    return c + d


def and_or_return_operands(x, y):
    # `and`/`or` on tensors return one of the operands (a tensor), not a bool.
    both = (x.sum() > 0) and (y.sum() > 0)
    either = (x.max() > 2) or (y.max() > 2)
    return both, either, x * both + y * either


def chained_comparison(x):
    if -1 < x.mean() < 1:
        return x * 10
    return x / 10


def early_returns(x):
    y = x.relu()
    if y.sum() == 0:
        return torch.zeros_like(x)
    z = y / y.sum()
    if z.max() > 0.5:
        return z * 2
    return z


def compare_two_tensors(x, y):
    if x.sum() > y.sum():
        big, small = x, y
    else:
        big, small = y, x
    return big - small, big.sum() >= small.sum()


def scalar_tensor_truthiness(x):
    if x.sum():  # a one-element tensor is true when nonzero
        x = x + 1
    if x[0] == x.max():
        return x * 2
    return x


# =============================================================================================
# B. while loops on tensor conditions
# =============================================================================================

def while_norm_halves(x):
    while x.norm() > 1:
        x = x / 2
    return x


def while_counts_steps(x):
    steps = 0
    while x.abs().max() > 0.1:
        x = x * 0.5
        steps += 1
    return x, steps


def while_true_break(x):
    n = 0
    while True:
        x = x * 2 + 1
        n += 1
        if x.sum() > 100 or n >= 10:
            break
    return x, n


def newton_sqrt(a):
    y = torch.ones_like(a)
    while (y * y - a).abs().max() > 1e-4:
        y = 0.5 * (y + a / y)
    return y


def while_on_item_budget(x):
    budget = x.abs().sum().item()
    out = x
    while budget > 1.0:
        out = out * 0.9
        budget = budget / 2
    return out, budget


# =============================================================================================
# C. .item(), .tolist(), int(t), float(t): Python numbers in arithmetic, branches and tensor ops
# =============================================================================================

def item_arithmetic(x):
    s = x.sum().item()
    t = s * 2 + 1
    if t > 0:
        return x * t
    return x - t


def tolist_loop(x):
    total = 0.0
    for v in x.tolist():
        if v > 0:
            total += v
    return x * total, total


def int_and_float(x):
    n = int(x.argmax())
    f = float(x.max())
    scale = f / (n + 1)
    if n % 2 == 0:
        return x * scale, n, f
    return x + scale, n, f


def item_sets_loop_count(x):
    k = int(x.abs().sum().item()) % 3 + 1
    for i in range(k):
        x = x + i
    return x, k


def min_max_normalize(x):
    hi = x.max().item()
    lo = x.min().item()
    if hi - lo > 1:
        return (x - lo) / (hi - lo)
    return x - lo


def tolist_rows_argmax(x):
    rows = x.tolist()
    sums = list(map(sum, rows))
    best = sums.index(max(sums))
    return x[best] * len(rows), best


def item_feeds_tensor_ops(x, y):
    s = x.mean().item()
    z = y * s + s ** 2
    if abs(s) > 0.5:
        z = torch.clamp(z, -abs(s), abs(s))
    return z, round(s, 4)


# =============================================================================================
# D. print and logging in the middle
# =============================================================================================

def print_in_middle(x):
    y = x + 1
    print("sum of y:", round(y.sum().item(), 4))
    return y * 2


def print_in_branches(x):
    if x.sum() > 0:
        print("positive", tuple(x.shape))
        x = x * 2
    else:
        print("not positive", x.dtype)
        x = x - 2
    print("done", "now", sep="-", end="!\n")
    return x


def print_tensor_values(x):
    y = x * 3
    print(y)
    print(f"{y.mean():.3f}", y.shape, sep=" | ")
    return y.sum()


def logging_calls(x):
    LOG.info("mean is %.4f", x.mean().item())
    y = x * 2
    if y.max() > 1:
        LOG.warning("large value %s", round(y.max().item(), 3))
    LOG.debug("shape %s", tuple(y.shape))
    return y


def module_logging_calls(x):
    y = x.abs()
    if y.max() > 2:
        logging.warning("max %.2f above 2", y.max().item())
    else:
        logging.error("max %.2f not above 2", y.max().item())
    return y * 2


def print_and_log_in_loop(xs):
    out = []
    for i, t in enumerate(xs):
        print("step", i)
        if t.sum() > 0:
            LOG.info("step %d positive", i)
        out.append(t.sum())
    return torch.stack(out)


# =============================================================================================
# E. Breaks inside for loops
# =============================================================================================

def for_range_branch(x, n):
    for i in range(n):
        if x[i] > 0:
            x = x + 1
        else:
            x = x * 2
    return x


def for_over_tensors(xs):
    total = torch.zeros(3)
    for t in xs:
        if t.sum() > 0:
            total = total + t
        else:
            total = total - t
    return total


def for_enumerate(xs):
    acc = xs[0] * 0
    for i, t in enumerate(xs):
        if t.mean() > 0:
            acc = acc + t * i
    return acc


def for_zip(xs, ys):
    out = []
    for a, b in zip(xs, ys):
        out.append(a * b if (a > b).any() else a + b)
    return out


def nested_loops(x):
    acc = torch.zeros(())
    for i in range(x.shape[0]):
        for j in range(x.shape[1]):
            if x[i, j] > 0:
                acc = acc + x[i, j]
    return acc


def break_on_condition(xs):
    acc = torch.zeros(2)
    for t in xs:
        if t.max() > 2:
            break
        acc = acc + t
    return acc


def continue_on_condition(xs):
    acc = torch.zeros(2)
    count = 0
    for t in xs:
        if t.sum() < 0:
            continue
        acc = acc + t
        count += 1
    return acc, count


def for_else_search(xs, target):
    for i, t in enumerate(xs):
        if torch.equal(t, target):
            found = i
            break
    else:
        found = -1
    return found, target * found


def iterate_tensor_rows(x):
    out = []
    for row in x:
        out.append(row.max() if row.sum() > 0 else row.min())
    return torch.stack(out)


def while_inside_for(xs):
    out = []
    for t in xs:
        while t.abs().max() > 1:
            t = t / 2
        out.append(t)
    return out


def print_inside_loop(x, n):
    for i in range(n):
        x = x * 2
        print("iteration", i, "max", round(x.max().item(), 3))
    return x


# =============================================================================================
# F. try / except / finally around breaks
# =============================================================================================

def raise_and_catch_in_branch(x):
    try:
        if x.sum() > 0:
            raise ValueError("positive input")
        y = x * 2
        msg = "ok"
    except ValueError as e:
        y = x - 1
        msg = str(e)
    return y, msg


def finally_runs(x):
    events = []
    try:
        events.append("try")
        if x.mean() > 0:
            return x * 2, events
        events.append("after branch")
    finally:
        events.append("finally")
    return x, events


def check_positive(t):
    if t.min() < 0:
        raise ValueError(f"negative entry {t.min().item():.3f}")
    return t.sqrt()


def catches_helper_error(x):
    y = x * 2
    try:
        z = check_positive(y)
        status = "ok"
    except ValueError as e:
        z = y.abs().sqrt()
        status = str(e)
    return z + 1, status


def try_except_else_finally(x):
    log = []
    vals = x.tolist()
    try:
        v = vals[int(x.argmax()) + 2]
    except IndexError:
        log.append("index")
        v = -1.0
    else:
        log.append("else")
    finally:
        log.append("finally")
    return x * v, log


def reraise_caught_outside(x):
    try:
        try:
            if x.sum() > 0:
                raise KeyError("inner")
            y = x + 1
        except KeyError:
            y = x - 1
            raise RuntimeError("converted")
    except RuntimeError as e:
        y = y * 10
        return y, str(e)
    return y, "none"


def zero_division_caught(x):
    s = int(x.sum().item())
    try:
        r = 10 // s
    except ZeroDivisionError:
        r = 0
    return x * r, r


def torch_error_caught(x):
    k = int(x.abs().sum().item())
    try:
        y = x.view(k, -1)
    except RuntimeError:
        y = x.view(1, -1)
    return y * 2


# =============================================================================================
# G. Exceptions raised after a break that escape the function
# =============================================================================================

def raises_after_branch(x):
    if x.sum() > 0:
        y = x + 1
    else:
        y = x - 1
    if y.max() > 3:
        raise ValueError(f"too large: {y.max().item():.2f}")
    return y


def helper_error_escapes(x):
    y = x.relu() - 0.5
    return check_positive(y) * 2


def key_error_after_item(x, table):
    key = "pos" if x.sum().item() > 0 else "neg"
    return table[key] * x


def assert_after_item(x):
    s = x.abs().sum().item()
    assert s < 10, f"sum too big: {s:.2f}"
    return x / s


def shape_error_after_branch(x, w):
    if x.mean() > 0:
        x = x.t()
    return x @ w


def error_inside_loop(xs):
    acc = 0
    for i, t in enumerate(xs):
        if t.sum() < 0:
            raise IndexError(f"negative at {i}")
        acc = acc + t
    return acc


# =============================================================================================
# H. Generators: compiled generator functions and functions that consume generators
# =============================================================================================

def generator_with_branches(x):
    for i in range(3):
        if x.sum() > 0:
            x = x - 1
            yield x
        else:
            yield x * i


def multiples(t, n):
    for i in range(n):
        yield t * i


def consumes_generator(x):
    total = torch.zeros_like(x)
    for v in multiples(x, 4):
        if v.sum() > 0:
            total = total + v
    return total


def generator_expressions(xs):
    first = xs[0].sum().item()
    positives = sum(t.sum() > 0 for t in xs)
    total = sum(t * 2 for t in xs)
    return total, positives, any(t.max() > 2 for t in xs), first


def collects_generator(x):
    parts = list(multiples(x, 3))
    if parts[-1].sum() > 0:
        parts.append(x)
    return torch.stack(parts), len(parts)


def list_comprehension_filter(xs):
    first = xs[0].sum().item()
    kept = [t * 2 for t in xs if t.sum() > 0]
    return (torch.stack(kept) if kept else torch.zeros(0, 2)), first


# =============================================================================================
# I. Nested calls and recursion
# =============================================================================================

def sign_scale(t):
    if t.sum() > 0:
        return t * 2
    return t * -1


def outer_calls_breaking_helper(x):
    y = x + 1
    z = sign_scale(y)
    return z - 1


def middle_layer(t):
    u = sign_scale(t) + 1
    if u.max() > 3:
        print("middle: large", round(u.max().item(), 3))
    return u


def two_levels_of_calls(x):
    return middle_layer(x * 2) + middle_layer(x - 1)


def halve_recursively(x, depth):
    if depth == 0 or x.norm() < 1:
        return x, depth
    return halve_recursively(x / 2, depth - 1)


def tree_sum(xs):
    if len(xs) == 1:
        t = xs[0]
        return t if t.sum() > 0 else -t
    mid = len(xs) // 2
    return tree_sum(xs[:mid]) + tree_sum(xs[mid:])


class Scaler:
    def __init__(self, factor):
        self.factor = factor

    def apply(self, t):
        if t.mean() > 0:
            return t * self.factor
        return t / self.factor


SCALER = Scaler(3.0)


def method_calls_break(x, scaler):
    y = scaler.apply(x)
    return scaler.apply(y + 1)


# =============================================================================================
# J. Side effects between breaks
# =============================================================================================

def appends_to_local_list(x):
    out = []
    for i in range(3):
        out.append(x * i)
        if out[-1].sum() > 1:
            out.append(x.neg())
    return torch.stack(out), len(out)


def mutates_in_place(x):
    x.mul_(2)
    if x.sum() > 0:
        x.add_(1)
    else:
        x.sub_(1)
    x[0] = x.max().item()
    return x.clone()


def stores_into_dict_arg(d, x):
    if x.sum() > 0:
        d["sign"] = "pos"
    else:
        d["sign"] = "neg"
    d["out"] = x * 2
    d["count"] = d.get("count", 0) + 1
    return d["out"].sum()


def appends_to_list_arg(log, x):
    s = x.sum().item()
    log.append(round(s, 4))
    if s > 0:
        log.append("positive")
    x = x * s
    log.append(tuple(x.shape))
    return x


# =============================================================================================
# The cases: (function, argument variants, graph bound, exits that must appear)
# =============================================================================================

class Case:
    def __init__(self, fn, variants, max_graphs, exits=()):
        self.fn = fn
        self.variants = variants
        self.max_graphs = max_graphs
        self.exits = set(exits)

    @property
    def id(self):
        return self.fn.__name__


POS3, NEG3 = T(1.0, 2.0, 3.0), T(-1.0, -2.0, 0.5)
TABLE = {"pos": torch.tensor(2.0), "neg": torch.tensor(-3.0)}

CASES = [
    # --- A. branches on tensor values ---
    Case(if_sum_positive, [(POS3,), (NEG3,)], 3, {"branch"}),
    Case(if_elif_else, [(T(1.0, 2.0),), (T(0.1, 0.2),), (T(-0.1, -0.2),), (T(-3.0, -1.0),)],
         7, {"branch"}),
    Case(nested_ifs, [(POS3, POS3), (POS3, NEG3), (NEG3, POS3), (NEG3, -POS3)], 7, {"branch"}),
    Case(and_or_conditions, [(POS3, POS3), (NEG3, T(-0.5, -2.0, 0.0)), (NEG3, T(0.1, 0.1, -0.5)),
                             (T(-0.5, 0.2, 0.1), T(0.5, 0.3, -0.4))], 7, {"branch"}),
    Case(not_conditions, [(POS3,), (NEG3,), (T(4.0, 5.0, 6.0),)], 5, {"branch"}),
    # bool(t) is a performed call; the branch on its (constant) result is followed in the trace
    Case(bool_of_tensor, [(POS3, torch.tensor(True)), (NEG3, torch.tensor(False)),
                          (NEG3, torch.tensor(True))], 3, {"call"}),
    Case(ternary_any_all, [(POS3, NEG3), (T(0.5, 0.1, 0.2), POS3)], 4, {"branch"}),
    Case(and_or_return_operands, [(POS3, POS3), (NEG3, POS3), (POS3, NEG3),
                                  (T(0.1, 0.2, 0.3), T(-1.0, 0.5, 0.4))], 5, {"branch"}),
    # two branches (one per comparison); the second's false side pops the stack in its own region
    Case(chained_comparison, [(T(0.1, 0.2),), (T(5.0, 6.0),), (T(-5.0, -6.0),)], 5, {"branch"}),
    Case(early_returns, [(T(-1.0, -2.0, -3.0),), (T(5.0, 0.1, 0.1),), (T(1.0, 1.0, 1.0),)],
         4, {"branch"}),
    Case(compare_two_tensors, [(POS3, NEG3), (NEG3, POS3)], 3, {"branch"}),
    Case(scalar_tensor_truthiness, [(T(1.0, -1.0, 0.0),), (T(3.0, 1.0, 2.0),), (T(1.0, 3.0),)],
         6, {"branch"}),
    # --- B. while loops ---
    Case(while_norm_halves, [(T(0.1, 0.2),), (T(3.0, 4.0),)], 2, {"branch"}),
    Case(while_counts_steps, [(T(0.05, 0.01),), (T(1.0, -0.5),)], 2, {"branch"}),
    Case(while_true_break, [(T(1.0, 2.0),), (T(-5.0, -5.0),)], 2, {"branch"}),
    Case(newton_sqrt, [(T(4.0, 9.0, 2.0),), (T(1.0, 1.0, 1.0),)], 2, {"branch"}),
    Case(while_on_item_budget, [(T(0.1, 0.2),), (T(3.0, 4.0),)], 2, {"call", "branch"}),
    # --- C. .item() / .tolist() / int() / float() ---
    Case(item_arithmetic, [(POS3,), (NEG3,)], 3, {"call", "branch"}),
    Case(tolist_loop, [(POS3,), (NEG3,)], 2, {"call"}),
    Case(int_and_float, [(T(3.0, 1.0, 2.0),), (T(1.0, 3.0, 2.0),)], 4, {"call", "branch"}),
    Case(item_sets_loop_count, [(T(0.5, 0.2),), (T(1.0, 0.5),), (T(2.0, 0.5),)], 4, {"call"}),
    Case(min_max_normalize, [(POS3,), (T(0.1, 0.2, 0.3),)], 4, {"call", "branch"}),
    Case(tolist_rows_argmax, [(torch.tensor([[1.0, 2.0], [3.0, 4.0]]),),
                              (torch.tensor([[5.0, 2.0], [3.0, 1.0]]),)], 2, {"call"}),
    Case(item_feeds_tensor_ops, [(POS3, NEG3), (T(0.1, 0.2, -0.1), POS3)], 3, {"call"}),
    # --- D. print and logging ---
    Case(print_in_middle, [(POS3,), (NEG3,)], 2, {"call"}),
    Case(print_in_branches, [(POS3,), (NEG3,)], 3, {"branch", "call"}),
    Case(print_tensor_values, [(POS3,), (T(-1.5, 0.25),)], 4, {"call"}),
    Case(logging_calls, [(POS3,), (T(0.1, 0.2, 0.3),)], 4, {"call", "branch"}),
    Case(module_logging_calls, [(POS3,), (T(0.1, -0.2, 0.3),)], 5, {"call", "branch"}),
    # LOG.info is a call the runtime makes, so the regions around it compile too.
    Case(print_and_log_in_loop, [([POS3, NEG3, POS3],), ([NEG3, NEG3],)], 7,
         {"call", "branch", "iterate"}),
    # --- E. loops ---
    Case(for_range_branch, [(POS3, 3), (NEG3, 3), (T(-1.0, 0.5, -2.0), 2)], 6, {"branch"}),
    # the first region reads the list, so it is compiled once per list length
    Case(for_over_tensors, [([POS3, NEG3, POS3],), ([NEG3, POS3],)], 5, {"branch", "iterate"}),
    Case(for_enumerate, [([POS3, NEG3, POS3],), ([NEG3, NEG3, POS3],)], 6, {"branch", "iterate"}),
    Case(for_zip, [([POS3, NEG3], [NEG3, POS3]), ([NEG3, NEG3], [POS3, POS3])], 5,
         {"branch", "iterate"}),
    Case(nested_loops, [(torch.tensor([[1.0, -2.0, 3.0], [-4.0, 5.0, -6.0]]),),
                        (torch.tensor([[-1.0, 2.0, -3.0], [4.0, -5.0, 6.0]]),)], 12, {"branch"}),
    Case(break_on_condition, [([T(1.0, 1.0), T(1.0, 3.0), T(1.0, 1.0)],),
                              ([T(0.5, 0.5), T(0.5, 0.5)],)], 4, {"branch", "iterate"}),
    Case(continue_on_condition, [([T(1.0, 1.0), T(-1.0, -3.0), T(2.0, 1.0)],),
                                 ([T(-0.5, -0.5), T(-0.5, 0.1)],)], 4, {"branch", "iterate"}),
    Case(for_else_search, [([POS3, NEG3], NEG3), ([POS3, NEG3], T(9.0, 9.0, 9.0))], 2,
         {"iterate"}),
    Case(iterate_tensor_rows, [(torch.tensor([[1.0, 2.0], [-3.0, -4.0], [5.0, -6.0]]),)], 7,
         {"branch"}),
    Case(while_inside_for, [([T(0.5, 0.1), T(4.0, -3.0)],), ([T(8.0, 0.0)],)], 4,
         {"branch", "iterate"}),
    Case(print_inside_loop, [(POS3, 3), (NEG3, 1)], 3, {"call"}),
    # --- F. try / except / finally ---
    # (the branch, then each side: the raising one reads str(e) in the trace)
    Case(raise_and_catch_in_branch, [(POS3,), (NEG3,)], 3, {"branch"}),
    Case(finally_runs, [(POS3,), (NEG3,)], 2, {"branch"}),
    # bounds count the graphs of hooked callees too (check_positive: branch, sqrt, .item())
    Case(catches_helper_error, [(POS3,), (NEG3,)], 5, {"call"}),
    Case(try_except_else_finally, [(T(3.0, 1.0, 2.0),), (T(1.0, 2.0, 3.0),)], 2, {"call"}),
    Case(reraise_caught_outside, [(POS3,), (NEG3,)], 3, {"branch"}),
    Case(zero_division_caught, [(T(1.0, 2.0),), (T(1.0, -1.0),)], 2, {"call"}),
    Case(torch_error_caught, [(T(1.0, 0.0, 0.0, 0.0, 1.0, 1.0),),  # view(3, -1) works
                              (T(1.0, 1.0, 1.0, 1.0, 0.0, 0.0),)], 2, {"call"}),  # (4, -1) raises
    # --- G. escaping exceptions ---
    Case(raises_after_branch, [(POS3,), (NEG3,), (T(1.0, 0.5, 0.5),)], 4, {"branch"}),
    Case(helper_error_escapes, [(POS3,), (T(0.1, 0.2, 0.3),)], 5, {"call"}),
    Case(key_error_after_item, [(POS3, TABLE), (NEG3, TABLE), (POS3, {"neg": TABLE["neg"]})], 3,
         {"call"}),
    Case(assert_after_item, [(POS3,), (T(10.0, 5.0),)], 3, {"call"}),
    Case(shape_error_after_branch, [(torch.ones(2, 3), torch.ones(3, 2)),
                                    (-torch.ones(2, 3), torch.ones(3, 2))], 3, {"branch"}),
    # enumerate(xs) is unrolled in the first region, an opaque iterator after the first break.
    Case(error_inside_loop, [([POS3, POS3],), ([POS3, NEG3, POS3],)], 5, {"branch", "iterate"}),
    # --- H. generators ---
    Case(generator_with_branches, [(POS3,), (NEG3,), (T(0.4, 0.4, 0.4),)], 8),
    Case(consumes_generator, [(POS3,), (NEG3,)], 3, {"branch", "iterate"}),
    # genexprs and comprehensions are their own frames; the function's own graphs: .item(), the
    # sums (performed calls) and the return
    Case(generator_expressions, [([POS3, NEG3],), ([NEG3, NEG3],)], 3, {"call"}),
    # the generator runs in the trace (list() drains it); the branch on its last part breaks
    Case(collects_generator, [(POS3,), (NEG3,)], 3, {"branch"}),
    # <listcomp> regions are keyed on the length of the list being built
    # the comprehension resumed after a break appends to its list (on the stack, read by
    # source): traced and written back, one more compiled region than when that ran as Python
    # (8: on 3.12+ the inlined comprehension after the .item() break is traced, its per-element
    # branches regions of their own; on 3.11 it is a function of its own)
    Case(list_comprehension_filter, [([POS3[:2], NEG3[:2]],), ([NEG3[:2]],)], 8, {"call"}),
    # --- I. nested calls and recursion ---
    Case(outer_calls_breaking_helper, [(POS3,), (-POS3,)], 5, {"call"}),
    Case(two_levels_of_calls, [(POS3,), (NEG3,), (T(0.1, 0.1, 0.1),)], 8, {"call"}),
    Case(halve_recursively, [(T(0.1, 0.2), 3), (T(3.0, 4.0), 5), (T(30.0, 40.0), 2)], 6,
         {"branch", "call"}),
    # (the tail after the first call, `tree_sum(xs[mid:])` with `mid` a local, is compiled: the
    # slice bound pinned to its value; it was left to CPython before)
    Case(tree_sum, [([POS3, NEG3, POS3, NEG3],), ([NEG3, NEG3, NEG3],)], 3, {"call"}),
    Case(method_calls_break, [(POS3, SCALER), (-POS3, SCALER), (T(-1.0, 0.0, 0.5), SCALER)], 4,
         {"call"}),
    # --- J. side effects between breaks ---
    # regions after an append are keyed on the list's length: 8 graphs for the path with two
    # appends, 3 more for the path with none
    Case(appends_to_local_list, [(POS3,), (NEG3,), (T(0.1, 0.1, 0.1),)], 11, {"branch"}),
    Case(mutates_in_place, [(POS3,), (NEG3,)], 4, {"branch", "call"}),
    # the stores are traced (written back at the exit): one region per branch side, and the
    # second call's dict has other keys
    Case(stores_into_dict_arg, [({}, POS3), ({"count": 4}, NEG3)], 3, {"branch"}),
    Case(appends_to_list_arg, [([], POS3), (["old"], NEG3)], 3, {"call", "branch"}),
]


# =============================================================================================
# Running a function and comparing outcomes
# =============================================================================================

def clone(obj):
    """Fresh copies of tensors inside tuples, lists and dicts; other objects as they are."""
    if isinstance(obj, torch.Tensor):
        return obj.clone()
    if isinstance(obj, tuple):
        return tuple(clone(o) for o in obj)
    if isinstance(obj, list):
        return [clone(o) for o in obj]
    if isinstance(obj, dict):
        return {k: clone(v) for k, v in obj.items()}
    return obj


class Outcome:
    """What one call did: its value or exception, stdout, log records, the arguments after."""

    def __init__(self, fn, args, capsys, caplog):
        capsys.readouterr()
        caplog.clear()
        self.value = self.error = self.tb = None
        try:
            result = fn(*args)
            if isinstance(result, types.GeneratorType):
                result = list(result)
            self.value = result
        except Exception as e:  # compared with eager below
            self.error = (type(e), str(e))
            self.tb = [(f.name, f.lineno, f.line) for f in traceback.extract_tb(e.__traceback__)]
        self.stdout = capsys.readouterr().out
        # framejit's own records (framejit.*) are not compared
        self.logs = [(r.name, r.levelno, r.getMessage(), r.funcName, r.lineno)
                     for r in caplog.records if r.name in (LOG.name, "root")]
        self.args = args


def assert_same_outcome(got, expected, what):
    assert got.error == expected.error, f"{what}: exception {got.error} != eager {expected.error}"
    if expected.error is None:
        assert same(got.value, expected.value), f"{what}: {got.value!r} != eager {expected.value!r}"
    else:
        assert got.tb[-1] == expected.tb[-1], (
            f"{what}: last traceback entry {got.tb[-1]} != eager {expected.tb[-1]}")
        assert got.tb == expected.tb, f"{what}: traceback {got.tb} != eager {expected.tb}"
    assert got.stdout == expected.stdout, (
        f"{what}: stdout {got.stdout!r} != eager {expected.stdout!r}")
    assert got.logs == expected.logs, f"{what}: log records {got.logs} != eager {expected.logs}"
    assert same(got.args, expected.args), f"{what}: arguments after the call differ from eager"


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_graph_break_case(case, capsys, caplog):
    counter = CompileCounter()
    compiled = framejit.compile(case.fn, backend=counter)
    with caplog.at_level(logging.DEBUG, logger=LOG.name):
        for i, args in enumerate(case.variants):
            expected = Outcome(case.fn, clone(args), capsys, caplog)
            got = Outcome(compiled, clone(args), capsys, caplog)
            assert_same_outcome(got, expected, f"variant {i}")

            graphs, n_regions = counter.frame_count, len(regions(case.fn))
            again = Outcome(compiled, clone(args), capsys, caplog)
            assert_same_outcome(again, expected, f"variant {i}, second call")
            assert counter.frame_count == graphs, f"variant {i}: second call compiled again"
            assert len(regions(case.fn)) == n_regions, f"variant {i}: second call added regions"

        assert counter.frame_count <= case.max_graphs, (
            f"{counter.frame_count} graphs, expected at most {case.max_graphs}")

        # Every path has been seen: another round over all variants compiles nothing.
        graphs, n_regions = counter.frame_count, len(regions(case.fn))
        for i, args in enumerate(case.variants):
            expected = Outcome(case.fn, clone(args), capsys, caplog)
            got = Outcome(compiled, clone(args), capsys, caplog)
            assert_same_outcome(got, expected, f"variant {i}, second round")
        assert counter.frame_count == graphs
        assert len(regions(case.fn)) == n_regions

    exits = {r["exit"] for r in regions(case.fn)}
    assert case.exits <= exits, f"region exits {exits} lack {case.exits - exits}"


def test_enough_cases():
    assert len({c.fn for c in CASES}) >= 45


def body_lines(code):
    """Line numbers of the instructions of code and of the code objects nested in it."""
    lines = {line for _, _, line in code.co_lines()
             if line is not None and line != code.co_firstlineno}
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            lines |= body_lines(const)
    return lines


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_variants_run_every_line_in_eager(case, capsys):
    """The variants are chosen so that every side of every branch runs (checked in eager)."""
    code = case.fn.__code__
    wanted = body_lines(code)
    seen = set()

    def tracer(frame, event, arg):
        if frame.f_code.co_filename == code.co_filename and event == "line":
            seen.add(frame.f_lineno)
        return tracer

    sys.settrace(tracer)
    try:
        for args in case.variants:
            try:
                result = case.fn(*clone(args))
                if isinstance(result, types.GeneratorType):
                    list(result)
            except Exception:
                pass
    finally:
        sys.settrace(None)
    assert wanted <= seen, f"lines never run by the variants: {sorted(wanted - seen)}"


ESCAPING = [raises_after_branch, helper_error_escapes, key_error_after_item, assert_after_item,
            shape_error_after_branch, error_inside_loop]


@pytest.mark.parametrize("fn", ESCAPING, ids=lambda f: f.__name__)
def test_escaping_cases_raise_and_return_in_eager(fn):
    """Section G is not vacuous: some variants raise out of the function, others return."""
    raised = []
    for args in next(c for c in CASES if c.fn is fn).variants:
        try:
            fn(*clone(args))
            raised.append(False)
        except Exception:
            raised.append(True)
    assert any(raised) and not all(raised)


# =============================================================================================
# Numbers from .item() entering a region are not specialised
# =============================================================================================

def test_item_values_do_not_recompile(capsys):
    counter = CompileCounter()
    compiled = framejit.compile(print_in_middle, backend=counter)
    xs = [T(1.0, 2.0, 3.0), T(0.5, 0.25, 4.0), T(-7.0, 2.0, 1.5), T(10.0, 20.0, 30.0)]
    compiled(xs[0])
    graphs, n_regions = counter.frame_count, len(regions(print_in_middle))
    for x in xs:
        capsys.readouterr()
        expected = print_in_middle(x)
        eager_out = capsys.readouterr().out
        assert same(compiled(x), expected)
        assert capsys.readouterr().out == eager_out
    assert counter.frame_count == graphs
    assert len(regions(print_in_middle)) == n_regions


def test_item_values_with_same_branch_outcome_do_not_recompile():
    counter = CompileCounter()
    compiled = framejit.compile(item_arithmetic, backend=counter)
    compiled(T(1.0, 2.0, 3.0))
    graphs, n_regions = counter.frame_count, len(regions(item_arithmetic))
    for x in (T(4.0, 5.0, 6.0), T(0.1, 0.2, -0.2), T(100.0, -1.0, 3.0)):
        assert same(compiled(x), item_arithmetic(x))
    assert counter.frame_count == graphs
    assert len(regions(item_arithmetic)) == n_regions


# =============================================================================================
# warm_branches=True: one call compiles both sides of each branch it performs
# =============================================================================================

@pytest.mark.parametrize("fn, first, other", [
    (if_sum_positive, (POS3,), (NEG3,)),
    (if_sum_positive, (NEG3,), (POS3,)),
    (compare_two_tensors, (POS3, NEG3), (NEG3, POS3)),
    (item_arithmetic, (POS3,), (NEG3,)),
    (min_max_normalize, (POS3,), (T(0.1, 0.2, 0.3),)),
    (chained_comparison, (T(0.1, 0.2),), (T(-5.0, -6.0),)),
], ids=["if_pos_first", "if_neg_first", "compare_two", "item_number_branch", "min_max",
        "chained_comparison"])
def test_warm_branches_compiles_the_other_side(fn, first, other):
    counter = CompileCounter()
    compiled = framejit.compile(fn, backend=counter, warm_branches=True)
    assert same(compiled(*clone(first)), fn(*clone(first)))
    graphs, n_regions = counter.frame_count, len(regions(fn))
    assert any(r["warmed"] for r in regions(fn)), "no region was compiled ahead of time"
    assert same(compiled(*clone(other)), fn(*clone(other)))
    assert counter.frame_count == graphs, "the other side of the branch compiled at its first use"
    assert len(regions(fn)) == n_regions


def test_warm_branches_with_print_on_both_sides(capsys):
    """Warming compiles the untaken side up to its first call it cannot make without running
    it (print): the part after that call compiles at its first use, and never performs a print
    ahead of time."""
    counter = CompileCounter()
    compiled = framejit.compile(print_in_branches, backend=counter, warm_branches=True)
    expected = print_in_branches(POS3.clone())
    eager_out = capsys.readouterr().out
    assert same(compiled(POS3.clone()), expected)
    assert capsys.readouterr().out == eager_out  # warming performs no print
    warmed = [r for r in regions(print_in_branches) if r["warmed"]]
    assert len(warmed) == 1 and warmed[0]["exit"] == "call"
    graphs = counter.frame_count
    expected = print_in_branches(NEG3.clone())
    eager_out = capsys.readouterr().out
    assert same(compiled(NEG3.clone()), expected)
    assert capsys.readouterr().out == eager_out
    assert counter.frame_count == graphs + 1  # x - 2 after the print, compiled when reached
    assert same(compiled(NEG3.clone()), print_in_branches(NEG3.clone()))
    assert counter.frame_count == graphs + 1


def test_without_warm_branches_the_other_side_compiles_later():
    counter = CompileCounter()
    compiled = framejit.compile(if_sum_positive, backend=counter)
    compiled(POS3.clone())
    graphs = counter.frame_count
    assert not any(r["warmed"] for r in regions(if_sum_positive))
    assert same(compiled(NEG3.clone()), if_sum_positive(NEG3.clone()))
    assert counter.frame_count == graphs + 1


# =============================================================================================
# fullgraph=True raises at the first break, naming the user's line
# =============================================================================================

def line_of(fn, text):
    """Line number and stripped text of the first line of fn's source containing text."""
    lines, first = inspect.getsourcelines(fn)
    for offset, line in enumerate(lines):
        if text in line:
            return first + offset, line.strip()
    raise AssertionError(f"{text!r} not in {fn.__name__}")


@pytest.mark.parametrize("fn, args, text", [
    (if_sum_positive, (POS3,), "if y.sum() > 0:"),
    (print_in_middle, (POS3,), "print(\"sum of y:\""),
    (item_arithmetic, (POS3,), "s = x.sum().item()"),
    (print_inside_loop, (POS3, 2), 'print("iteration"'),
    (outer_calls_breaking_helper, (POS3,), "z = sign_scale(y)"),
    (while_norm_halves, (T(3.0, 4.0),), "while x.norm() > 1:"),
], ids=["branch", "print", "item", "print_in_loop", "user_call", "while"])
def test_fullgraph_raises_at_first_break(fn, args, text, capsys):
    compiled = framejit.compile(fn, backend=CompileCounter(), fullgraph=True)
    with pytest.raises(framejit.Unsupported) as info:
        compiled(*clone(args))
    lineno, source = line_of(fn, text)
    message = str(info.value)
    assert f"test_graph_breaks.py:{lineno}" in message, message
    assert source in message, message
    assert capsys.readouterr().out == ""  # nothing after the break ran


# =============================================================================================
# Leaks: 100,000 calls through branches and performed calls
# =============================================================================================

def branch_and_item(x):
    y = x * 2
    s = y.sum().item()
    if s > 0:
        return y + s
    return y - s


def test_100k_calls_with_breaks_leak_nothing():
    counter = CompileCounter()
    compiled = framejit.compile(branch_and_item, backend=counter)
    refs = []
    first = [T(1.0, 2.0), T(-1.0, -2.0)]  # the calls that compile: the backend's example inputs
    for x in first:
        refs.append(weakref.ref(x))
        out = compiled(x)
        refs.append(weakref.ref(out))
        assert same(out, branch_and_item(x))
    del first, x, out
    pos, neg = T(0.5, 0.25), T(-0.5, -0.25)
    for i in range(10_000 - 2):
        compiled(pos if i % 2 else neg)
    gc.collect()
    objects_at_10k = len(gc.get_objects())
    for i in range(90_000):
        compiled(pos if i % 2 else neg)
    gc.collect()
    growth = len(gc.get_objects()) - objects_at_10k
    assert growth <= 50, f"{growth} more gc-tracked objects between call 10,000 and 100,000"
    graphs = counter.frame_count
    for _ in range(3):  # fresh inputs after the cache is warm
        x = torch.randn(2)
        refs.append(weakref.ref(x))
        out = compiled(x)
        refs.append(weakref.ref(out))
        del x, out
    assert counter.frame_count == graphs
    gc.collect()
    assert [r() for r in refs] == [None] * len(refs)


def comprehension_after_a_break(x, flag):
    if flag:
        t = x + 1
    print("break")  # the next region starts mid-frame
    doubled = [t * 2 for t in (x, x + 1)]  # 3.12+: saves `t` (bound or not) and puts it back
    return doubled[0] + doubled[1] + (t if flag else 0)


def test_a_comprehension_in_a_region_entered_mid_frame_is_traced(capsys):
    # On 3.12 and later a comprehension is inlined: it saves the enclosing frame's variable of
    # the same name, unbound here when flag is False, which the region reads as a guarded
    # fact (bound or not) instead of ending there.
    counter = CompileCounter()
    compiled = framejit.compile(comprehension_after_a_break, backend=counter)
    x = torch.randn(3)
    for flag in (True, False, True, False):
        assert same(compiled(x, flag), comprehension_after_a_break(x, flag))
    exits = [r["exit"] for r in regions(comprehension_after_a_break)]
    assert "deopt" not in exits and exits.count("return") == 2  # one per flag
    capsys.readouterr()
