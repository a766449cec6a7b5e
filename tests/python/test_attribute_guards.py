"""getattr / hasattr and nn.Module's tree generators answered at trace time: what they read is
guarded, so changing it between calls compiles again instead of reusing a stale answer. Each
test mutates the object between calls and compares every result with eager."""
import pytest
import torch
import torch.nn as nn

import framejit
from framejit.testing import CompileCounter, same


def run_with_mutations(fn, mutations, args=None):
    """Calls fn compiled and eagerly before the first mutation and after each one; returns the
    number of graphs."""
    counter = CompileCounter()
    compiled = framejit.compile(fn, backend=counter)
    args = args if args is not None else (torch.ones(3),)
    for mutate in [None] + list(mutations):
        if mutate is not None:
            mutate()
        assert same(compiled(*args), fn(*args))
    return counter.frame_count


class Plain:
    pass


def test_instance_attribute_deleted_after_hasattr_found_it():
    o = Plain()
    o.foo = 1

    def fn(x):
        return x + (1 if hasattr(o, "foo") else 2)

    assert run_with_mutations(fn, [lambda: delattr(o, "foo"), lambda: setattr(o, "foo", 5)]) == 2


def test_class_attribute_added_after_hasattr_missed_it():
    class P:
        pass

    p = P()

    def fn(x):
        return x + (1 if hasattr(p, "bar") else 2) + getattr(p, "bar", 10)

    def add():
        P.bar = 1

    assert run_with_mutations(fn, [add]) == 2


def test_hasattr_on_a_class_object():
    class Q:
        pass

    def fn(x):
        return x * (3 if hasattr(Q, "q") else 4)

    def add():
        Q.q = 0

    assert run_with_mutations(fn, [add]) == 2


def test_module_parameter_deleted():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.ones(3))

        def forward(self, x):
            return x * self.w if hasattr(self, "w") else x - 1

    m = M()
    counter = CompileCounter()
    compiled = framejit.compile(m, backend=counter)
    x = torch.ones(3)
    assert same(compiled(x), m(x))
    del m.w
    assert same(compiled(x), m(x))
    assert counter.frame_count == 2


def test_attribute_stored_earlier_in_the_same_trace():
    class Holder:
        pass

    def fn(x, q):
        q.z = x * 2
        return x + 1 if getattr(q, "z", None) is None else q.z

    q1, q2 = Holder(), Holder()
    counter = CompileCounter()
    compiled = framejit.compile(fn, backend=counter)
    x = torch.ones(3)
    assert same(compiled(x, q1), fn(x, q2))


def test_hasattr_on_a_bound_method_is_left_to_python():
    class A:
        def m(self):
            return 1

    a = A()

    def fn(x):
        return x * (2 if hasattr(a.m, "__self__") else 3)

    assert run_with_mutations(fn, []) <= 1


def test_patching_and_restoring_nn_module_keeps_the_graph():
    # torch.fx and make_fx patch nn.Module.__call__ and put it back: every module class gets a
    # new attribute version tag, but what the guard asked for is unchanged.
    class M(nn.Module):
        def forward(self, x):
            return x * (2 if hasattr(self, "missing") else 3)

    m = M()
    counter = CompileCounter()
    compiled = framejit.compile(m, backend=counter)
    x = torch.ones(3)
    assert same(compiled(x), m(x))
    call = nn.Module.__call__
    nn.Module.__call__ = call  # what a patch-and-restore leaves behind
    assert same(compiled(x), m(x))
    assert counter.frame_count == 1


class TwoLayers(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(2, 2)
        self.b = nn.Linear(2, 2)

    def forward(self, x):
        return x * len(list(self.modules())) + sum(p.sum() for p in self.parameters())


def test_retying_modules_and_parameters_recompiles():
    model = TwoLayers()
    counter = CompileCounter()
    compiled = framejit.compile(model, backend=counter)
    x = torch.ones(2)
    assert same(compiled(x), model(x))
    model.b = model.a  # one module twice: modules() and parameters() list it once
    assert same(compiled(x), model(x))
    model.b = nn.Linear(2, 2)
    model.b.weight = model.a.weight  # a tied parameter
    assert same(compiled(x), model(x))
    assert counter.frame_count == 3


@pytest.mark.parametrize("prefix, recurse, remove_duplicate", [
    ("", True, True), ("top", True, True), ("", False, True), ("", True, False),
])
def test_named_parameters_options(prefix, recurse, remove_duplicate):
    model = TwoLayers()
    model.b.weight = model.a.weight

    def fn(x):
        names = [n for n, _ in model.named_parameters(prefix=prefix, recurse=recurse,
                                                      remove_duplicate=remove_duplicate)]
        return x * len(names)

    assert run_with_mutations(fn, [], args=(torch.ones(2),)) == 1


def test_sum_of_rows_with_a_tensor_start_is_one_graph():
    def fn(x, start):
        return sum(x, start) * 2

    counter = CompileCounter()
    compiled = framejit.compile(fn, backend=counter)
    x, start = torch.randn(3, 4), torch.randn(4)
    assert same(compiled(x, start), fn(x, start))
    assert counter.frame_count == 1


def test_setattr_is_an_attribute_store_replayed_at_the_exit():
    class Box:
        pass

    box = Box()
    box.count = 0

    def fn(x):
        setattr(box, "last", x * 2)
        setattr(box, "count", box.count + 1)
        return box.last + box.count

    counter = CompileCounter()
    compiled = framejit.compile(fn, backend=counter)
    x = torch.ones(3)
    assert same(compiled(x), torch.full((3,), 3.0))
    assert same(box.last, x * 2) and box.count == 1
    assert same(compiled(x), torch.full((3,), 4.0)) and box.count == 2


def test_list_iadd_on_a_caller_list_is_never_lost():
    def fn(items, x):
        items += [3]
        return x + 1

    counter = CompileCounter()
    compiled = framejit.compile(fn, backend=counter)
    mine, theirs = [1, 2], [1, 2]
    assert same(compiled(mine, torch.ones(2)), fn(theirs, torch.ones(2)))
    assert mine == theirs == [1, 2, 3]


def test_list_iadd_keeps_aliases():
    def fn(x):
        a = [1]
        b = a
        a += [2]
        return x * len(b), b

    assert run_with_mutations(fn, []) == 1


def test_keyword_given_twice_raises_as_in_eager():
    def g(a, b=0):
        return a + b

    def fn(d, x):
        return g(a=x, **d)

    compiled = framejit.compile(fn, backend=CompileCounter())
    with pytest.raises(TypeError):
        fn({"a": 1}, torch.ones(2))
    with pytest.raises(TypeError):
        compiled({"a": 1}, torch.ones(2))


def test_dict_key_true_is_not_key_one():
    def fn(d, x):
        return x + 1, {**d}

    counter = CompileCounter()
    compiled = framejit.compile(fn, backend=counter)
    for d in ({1: 2, "a": 3}, {True: 2, "a": 3}):
        out, copy = compiled(d, torch.ones(2))
        assert list(copy) == list(d) and type(list(copy)[0]) is type(list(d)[0])


def test_attribute_written_through_one_reference_read_through_another():
    class Obj:
        a = 0

    def fn(o, p, x):
        setattr(o, "a", x * 2)
        return p.a + 1

    o = Obj()
    compiled = framejit.compile(fn, backend=CompileCounter())
    x = torch.ones(2)
    assert same(compiled(o, o, x), torch.full((2,), 3.0))


def test_tuple_plus_size_is_a_size():
    def fn(x):
        return x.reshape((1,) + x.shape), type((1,) + x.shape) is torch.Size

    compiled = framejit.compile(fn, backend=CompileCounter())
    out, is_size = compiled(torch.ones(2, 3))
    assert is_size and out.shape == (1, 2, 3)


class Scaled:
    def __init__(self):
        self.scale = 2
        self.shift = 1


class ScaledThroughSetattr(Scaled):
    def __setattr__(self, key, value):
        super().__setattr__(key, value)


@pytest.mark.parametrize("cls", [Scaled, ScaledThroughSetattr])
@pytest.mark.parametrize("read", ["item", "items", "vars"])
def test_an_instance_dict_read_by_item_sees_attribute_writes(cls, read):
    # Python 3.13 writes an attribute into the object's inline values, which its __dict__
    # shares, without a new dict version: the item guard must read the dict again.
    o = cls()

    def fn(x):
        if read == "item":
            return x * o.__dict__["scale"] + o.__dict__["shift"]
        if read == "vars":
            return x * vars(o)["scale"] + vars(o)["shift"]
        total = x
        for key, value in o.__dict__.items():
            total = total * value if key == "scale" else total + value
        return total

    def write_scale():
        o.scale = 5

    def write_shift():
        object.__setattr__(o, "shift", 7)

    assert run_with_mutations(fn, [write_scale, write_shift]) == 3


def test_truth_of_an_object_without_bool_or_len_is_guarded_on_its_class():
    class Flag:
        pass

    holder = Flag()
    holder.flag = Flag()

    def f(x):
        return x + 1 if holder.flag else x - 1

    counter = CompileCounter()
    compiled = framejit.compile(f, backend=counter)
    x = torch.zeros(2)
    assert same(compiled(x), x + 1) and counter.frame_count == 1
    Flag.__len__ = lambda self: 0  # now false: the graph that assumed truth must not run
    try:
        assert same(compiled(x), f(x)) and same(f(x), x - 1)
        assert counter.frame_count == 2
    finally:
        del Flag.__len__
