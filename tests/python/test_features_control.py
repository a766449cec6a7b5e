"""Feature tests for control flow and Python values known at trace time: if/else, loops over
range/list/tuple/dict views/enumerate/zip/reversed, while with constant conditions,
break/continue, comprehensions, builtins (any/all/sum/min/max/len/isinstance/getattr/hasattr/
type), strings, math on constants, list/tuple/dict methods, starred unpacking, and context
managers. One construct per function; each compiled and checked against eager with its exact
graph count and the kinds of its region exits. Branches on tensor *values* are in
test_graph_breaks.py; here every condition is known when the trace runs."""
import math

import pytest
import torch

from feature_checks import check, rand

ONE = {"return"}  # one region that runs to the return: no break
CALL = {"call", "return"}  # the runtime performs the call(s); the rest compiles
SCALES = {"a": 1.0, "b": 2.0, "c": 3.0}
NAMES = ("relu", "tanh")


class Box:
    size = 3

    def grow(self, t):
        return t * self.size


BOX = Box()


# ---------------------------------------------------------------------------------------------
# Branches on values known at trace time
# ---------------------------------------------------------------------------------------------

def if_else_on_flag(x, flag):
    if flag:
        return x + 1
    else:
        return x - 1


def if_elif_on_int(x, n):
    if n < 0:
        return -x
    elif n == 2:
        return x * 2
    return x


def if_is_none(x, bias):
    if bias is not None:
        x = x + bias
    return x * 2


def conditional_expression(x, n):
    return x * 2 if n > 1 else x / 2


def and_or_on_constants(x, a, b):
    if a and not b:
        return x + 1
    return x - 1


def chained_comparison_on_ints(x, n):
    if 0 < n <= 3:
        return x * n
    return x


def in_operator_on_tuple(x, name):
    if name in NAMES:
        return getattr(torch, name)(x)
    return x


# ---------------------------------------------------------------------------------------------
# for / while loops unrolled at trace time
# ---------------------------------------------------------------------------------------------

def for_range(x):
    for i in range(3):
        x = x + i
    return x


def for_range_start_stop_step(x):
    for i in range(10, 0, -3):
        x = x * 0.5 + i
    return x


def for_over_list(x):
    for k in [1.0, 2.0, 3.0]:
        x = x * k
    return x


def for_over_tuple_of_tensors(x):
    for t in (x, x * 2):
        x = x + t
    return x


def for_dict_items(x):
    for name, k in SCALES.items():
        x = x + k
    return x


def for_dict_keys(x):
    for name in SCALES.keys():
        x = x * SCALES[name]
    return x


def for_dict_values(x):
    for k in SCALES.values():
        x = x - k
    return x


def for_dict_directly(x):
    for name in SCALES:
        x = x + len(name)
    return x


def for_enumerate_start(x):
    for i, k in enumerate([2.0, 3.0], start=1):
        x = x + i * k
    return x


def for_zip(x):
    for a, b in zip([1.0, 2.0], (3.0, 4.0)):
        x = x * a + b
    return x


def for_reversed(x):
    out = []
    for t in reversed([x, x + 1, x + 2]):
        out.append(t)
    return torch.stack(out)


def for_nested_loops(x):
    for i in range(2):
        for j in range(3):
            x = x + i * j
    return x


def while_constant_counter(x):
    i = 0
    while i < 4:
        x = x * 2
        i += 1
    return x


def while_true_with_break(x):
    n = 0
    while True:
        n += 1
        if n == 3:
            break
    return x * n


def for_break(x):
    for i in range(10):
        if i == 3:
            break
        x = x + i
    return x


def for_continue(x):
    for i in range(5):
        if i % 2:
            continue
        x = x + i
    return x


def for_else(x):
    for i in range(3):
        x = x + i
    else:
        x = x * 10
    return x


# ---------------------------------------------------------------------------------------------
# Comprehensions
# ---------------------------------------------------------------------------------------------

def list_comprehension_with_filter(x):
    return torch.stack([x * i for i in range(5) if i % 2 == 0])


def dict_comprehension(x):
    d = {name: x * k for name, k in SCALES.items()}
    return d["b"] + d["c"]


def set_comprehension(x):
    s = {i % 3 for i in range(7)}
    return x * len(s)


def dict_comprehension_of_tensors(x):
    d = {i: x * i for i in range(3)}
    return torch.stack([d[k] for k in d]) + d[2]


def generator_expression_in_builtins(x, n):
    flags = any(i > n for i in range(3)), all(i >= 0 for i in range(3))
    return x * max(i * n for i in range(3)) + len(tuple(str(i) for i in range(n))), flags


def nested_comprehension(x):
    rows = [[x * i + j for j in range(2)] for i in range(3)]
    return torch.stack([torch.stack(r) for r in rows])


def generator_expression_in_sum(x):
    return x * sum(i * i for i in range(4))


# ---------------------------------------------------------------------------------------------
# Builtins on trace-time values
# ---------------------------------------------------------------------------------------------

def any_all_on_bools(x):
    flags = [True, False, True]
    return x * (2 if any(flags) else 1) + (1 if all(flags) else 0)


def sum_of_tensor_list(x):
    return sum([x, x * 2, x * 3])


def min_max_of_numbers(x):
    return x * min(3, 1, 2) + max([4.0, 5.0])


def min_max_of_shapes(x):
    return x.reshape(-1)[: min(x.shape)] * max(x.shape)


def len_of_list(x):
    return x * len([1, 2, 3])


def isinstance_single_type(x, y):
    if isinstance(y, int):
        return x * y
    return x + y


def isinstance_tuple_of_types(x, y):
    if isinstance(y, (int, float)):
        return x * y
    return x + y


def isinstance_of_tensor(x):
    if isinstance(x, torch.Tensor):
        return x * 2
    return x


def type_check(x, y):
    if type(y) is int:
        return x * y
    return x


def getattr_with_default(x):
    return x * getattr(BOX, "size", 1) + getattr(BOX, "missing", 0)


def hasattr_check(x):
    if hasattr(BOX, "grow"):
        return BOX.grow(x)
    return x


def abs_round_divmod(x):
    q, r = divmod(17, 5)
    return x * abs(-2) + round(2.6) + q - r


def sorted_and_reversed_numbers(x):
    ks = sorted([3, 1, 2], reverse=True)
    return x * ks[0] - ks[-1]


# ---------------------------------------------------------------------------------------------
# Strings and math on constants
# ---------------------------------------------------------------------------------------------

def fstring_as_key(x):
    d = {"layer0": 1.0, "layer1": 2.0}
    i = 1
    return x * d[f"layer{i}"]


def str_format_as_key(x):
    d = {"w_2": 3.0}
    return x * d["w_{}".format(2)]


def string_methods(x):
    name = "Scale_Two"
    if name.lower().startswith("scale") and name.split("_")[1] == "Two":
        return x * 2
    return x


def math_on_constants(x):
    return x * math.sqrt(4.0) + math.pi + math.log(math.e) + math.floor(2.7)


def math_on_shapes(x):
    return x / math.sqrt(x.shape[-1])


# ---------------------------------------------------------------------------------------------
# list / tuple / dict methods and unpacking on local values
# ---------------------------------------------------------------------------------------------

def list_append_extend(x):
    out = [x]
    out.append(x * 2)
    out.extend([x * 3, x * 4])
    return torch.stack(out)


def list_pop_insert(x):
    out = [x, x + 1, x + 2]
    last = out.pop()
    out.insert(0, last)
    return torch.stack(out)


def list_reverse_copy_clear(x):
    out = [x, x + 1, x + 2]
    out.reverse()
    kept = out.copy()
    out.clear()
    return torch.stack(kept), len(out)


def list_index_count(x):
    ks = [1, 2, 2, 3]
    return x * ks.index(3) + ks.count(2)


def list_slice_and_concat(x):
    ks = [1.0, 2.0, 3.0, 4.0]
    return x * sum(ks[1:3] + ks[:1])


def finfo_min_as_mask_value(x):
    return x.masked_fill(x < 0, torch.finfo(x.dtype).min) + torch.iinfo(torch.int8).max


def _scaled(x, scale=1.0, shift=0.0):
    return x * scale + shift


def kwargs_passed_through(x, **kwargs):
    return _scaled(x, **kwargs)


def next_of_unrolled_iterator(x):
    it = (x * k for k in (1, 2))  # a generator expression: unrolled at trace time
    first = next(it)
    return first + next(it) + next(it, x)


def tuple_accumulated_with_iadd(x):
    hidden = ()
    for scale in (1, 2, 3):
        x = x * scale
        hidden += (x,)
    return torch.stack(hidden)


def list_concat_of_tensors(x):
    return torch.stack([x] + [x * 2])


def tuple_index_count(x):
    ks = (5, 6, 6)
    return x * ks.count(6) + ks.index(5)


def dict_get_with_default(x):
    d = {"a": 2.0}
    return x * d.get("a", 0.0) + d.get("z", 1.0)


def dict_update_and_keys(x):
    d = {"a": x}
    d.update(b=x * 2, c=x * 3)
    return torch.stack([d[k] for k in d.keys()])


def dict_update_from_dict(x):
    d = {"a": x}
    d.update({"b": x * 2, "a": x + 1})
    e = d.copy()
    e["c"] = x * 3
    return d["a"] + d["b"] + e["c"], len(d), len(e)


def dict_pop_setdefault(x):
    d = {"a": x, "b": x * 2}
    a = d.pop("a")
    d.setdefault("c", x * 3)
    return a + d["b"] + d["c"], len(d)


def dict_in_and_len(x):
    d = {"a": 1}
    return x * len(d) + (1 if "a" in d else 0)


def starred_unpacking(x):
    first, *rest = [x, x * 2, x * 3]
    return first + torch.stack(rest).sum(0)


def starred_in_loop_target(x):
    out = x
    for first, *rest in [(1, 2, 3), (4, 5)]:
        out = out * first + sum(rest)
    return out


def starred_in_middle(x):
    a, *mid, b = (1, 2, 3, 4, 5)
    return x * a + len(mid) * b


def nested_tuple_unpacking(x):
    (a, b), c = (x, x + 1), x + 2
    return a * b - c


def star_into_list_display(x):
    ks = [1, 2]
    return x * len([*ks, 3, *ks])


def swap_by_tuple_assignment(x):
    a, b = x, x * 2
    a, b = b, a
    return a - b


def global_constant_read(x):
    return x * SCALES["c"]


X = rand(3, 4)

CASES = [
    # (function, arguments, graphs, region exits)
    (if_else_on_flag, (X, True), 1, ONE),
    (if_elif_on_int, (X, 2), 1, ONE),
    (if_is_none, (X, None), 1, ONE),
    (conditional_expression, (X, 3), 1, ONE),
    (and_or_on_constants, (X, 1, 0), 1, ONE),
    (chained_comparison_on_ints, (X, 2), 1, ONE),
    (in_operator_on_tuple, (X, "tanh"), 1, ONE),
    (for_range, (X,), 1, ONE),
    (for_range_start_stop_step, (X,), 1, ONE),
    (for_over_list, (X,), 1, ONE),
    (for_over_tuple_of_tensors, (X,), 1, ONE),
    # dict views of a global dict are unrolled (its keys are guarded)
    (for_dict_items, (X,), 1, ONE),
    (for_dict_keys, (X,), 1, ONE),
    (for_dict_values, (X,), 1, ONE),
    # iterating the dict itself: as iterating its keys (guarded in order)
    (for_dict_directly, (X,), 1, ONE),
    (for_enumerate_start, (X,), 1, ONE),
    (for_zip, (X,), 1, ONE),
    (for_reversed, (X,), 1, ONE),
    (for_nested_loops, (X,), 1, ONE),
    (while_constant_counter, (X,), 1, ONE),
    (while_true_with_break, (X,), 1, ONE),
    (for_break, (X,), 1, ONE),
    (for_continue, (X,), 1, ONE),
    (for_else, (X,), 1, ONE),
    (list_comprehension_with_filter, (X,), 1, ONE),
    (dict_comprehension, (X,), 1, ONE),
    (dict_comprehension_of_tensors, (X,), 1, ONE),
    # sets of constants are traced (BUILD_SET, SET_ADD)
    (set_comprehension, (X,), 1, ONE),
    (nested_comprehension, (X,), 1, ONE),
    # generator expressions consumed by a builtin are run while tracing
    (generator_expression_in_sum, (X,), 1, ONE),
    (generator_expression_in_builtins, (X, 2), 1, ONE),
    (any_all_on_bools, (X,), 1, ONE),
    (sum_of_tensor_list, (X,), 1, ONE),
    (min_max_of_numbers, (X,), 1, ONE),
    (min_max_of_shapes, (X,), 1, ONE),
    (len_of_list, (X,), 1, ONE),
    (isinstance_single_type, (X, 3), 1, ONE),
    (isinstance_tuple_of_types, (X, 3), 1, ONE),
    (isinstance_of_tensor, (X,), 1, ONE),
    (type_check, (X, 3), 1, ONE),
    # getattr() / hasattr(): an attribute BOX lacks is guarded absent from its __dict__
    (getattr_with_default, (X,), 1, ONE),
    (hasattr_check, (X,), 1, ONE),
    (abs_round_divmod, (X,), 1, ONE),
    (sorted_and_reversed_numbers, (X,), 1, ONE),
    (fstring_as_key, (X,), 1, ONE),
    (str_format_as_key, (X,), 1, ONE),
    (string_methods, (X,), 1, ONE),
    (math_on_constants, (X,), 1, ONE),
    (math_on_shapes, (X,), 1, ONE),
    (list_append_extend, (X,), 1, ONE),
    # list methods on a list made in the trace
    (list_pop_insert, (X,), 1, ONE),
    (list_reverse_copy_clear, (X,), 1, ONE),
    (list_index_count, (X,), 1, ONE),
    (list_slice_and_concat, (X,), 1, ONE),
    # `+` and `+=` on sequences holding tensors
    (list_concat_of_tensors, (X,), 1, ONE),
    (tuple_accumulated_with_iadd, (X,), 1, ONE),
    (finfo_min_as_mask_value, (X,), 1, ONE),
    (next_of_unrolled_iterator, (X,), 1, ONE),
    (tuple_index_count, (X,), 1, ONE),
    (dict_get_with_default, (X,), 1, ONE),
    # dict.update with keyword arguments
    (dict_update_and_keys, (X,), 1, ONE),
    # dict methods on a dict made in the trace
    (dict_update_from_dict, (X,), 1, ONE),
    (dict_pop_setdefault, (X,), 1, ONE),
    (dict_in_and_len, (X,), 1, ONE),
    # UNPACK_EX (a, *b = ...)
    (starred_unpacking, (X,), 1, ONE),
    (starred_in_middle, (X,), 1, ONE),
    (starred_in_loop_target, (X,), 1, ONE),
    (nested_tuple_unpacking, (X,), 1, ONE),
    (star_into_list_display, (X,), 1, ONE),
    (swap_by_tuple_assignment, (X,), 1, ONE),
    (global_constant_read, (X,), 1, ONE),
]


@pytest.mark.parametrize("fn,args,graphs,exits", CASES, ids=[c[0].__name__ for c in CASES])
def test_control_construct(fn, args, graphs, exits):
    check(fn, *args, graphs=graphs, exits=exits)


def test_callers_kwargs_dict_passed_on_with_double_star():
    # f(**kwargs) where kwargs is the compiled function's own **kwargs dict: its keys are
    # guarded in order and its values read by source, so one graph serves new values.
    import framejit
    from framejit.testing import CompileCounter, same
    counter = CompileCounter()
    compiled = framejit.compile(kwargs_passed_through, backend=counter)
    x = rand(3, 4)
    for scale in (2.0, 3.0):
        kwargs = {"scale": torch.tensor(scale), "shift": torch.tensor(1.0)}
        assert same(compiled(x, **kwargs), kwargs_passed_through(x, **kwargs))
    assert counter.frame_count == 1
    kwargs = {"scale": torch.tensor(2.0)}  # another key list: a new graph
    assert same(compiled(x, **kwargs), kwargs_passed_through(x, **kwargs))
    assert counter.frame_count == 2
