"""torch.utils._pytree called from traced code (x-transformers' and accelerate's helpers flatten
their arguments with it): inlined as torch.compile inlines it, each function compared with eager
with its graph count, the TreeSpecs it makes rebuilt where they leave the trace, and the
structure it reads guarded (a new structure, or a class registered later, compiles again)."""
import collections
import dataclasses
import typing

import torch
import torch.utils._pytree as pytree

import framejit
from framejit.testing import CompileCounter, regions, same

Pair = collections.namedtuple("Pair", "first second")


def doubles_a_nested_tree(x, y):
    leaves, spec = pytree.tree_flatten({"a": x, "b": [y, (x, None)]})
    out = pytree.tree_unflatten([leaf * 2 if leaf is not None else leaf for leaf in leaves], spec)
    return out["a"] + out["b"][0] + out["b"][1][0]


def maps_a_namedtuple_and_numbers(x, y):
    out = pytree.tree_map(lambda t: t * 2 if isinstance(t, torch.Tensor) else t,
                          {"p": Pair(x, None), "q": [y, (x, 2.0)]})
    return out["p"].first + out["q"][1][0] * out["q"][1][1]


def maps_only_tensors(x, y):
    out = pytree.tree_map_only(torch.Tensor, lambda t: t.relu(), [x, 3, {"z": y}])
    return out[0] + out[2]["z"] + out[1]


def sums_leaves(x, y):
    return sum(pytree.tree_leaves({"a": x, "b": (y, x)}, is_leaf=lambda t: isinstance(t, torch.Tensor)))


def reads_paths(x, y):
    leaves, _ = pytree.tree_flatten_with_path({"a": x, "b": [y]})
    (path, leaf), (other_path, other) = leaves
    return leaf + other, str(path[0]) + str(other_path[1])


def returns_its_spec(x, y):
    leaves, spec = pytree.tree_flatten((x, [y, y]))
    return leaves[0] * spec.num_leaves, spec


def test_pytree_functions_are_inlined_into_one_graph_with_eagers_results():
    x, y = torch.randn(3), torch.randn(3)
    for fn in (doubles_a_nested_tree, maps_a_namedtuple_and_numbers, maps_only_tensors, sums_leaves,
               reads_paths, returns_its_spec):
        framejit.reset()
        counter = CompileCounter()
        compiled = framejit.compile(fn, backend=counter)
        for _ in range(2):
            assert same(compiled(x, y), fn(x, y)), fn.__name__
        assert counter.frame_count == 1, fn.__name__
        assert [r["exit"] for r in regions(fn)] == ["return"], fn.__name__


def test_a_treespec_made_in_the_trace_leaves_it_equal_to_eagers():
    x, y = torch.randn(3), torch.randn(3)
    _, spec = framejit.compile(returns_its_spec, backend="eager")(x, y)
    _, expected = returns_its_spec(x, y)
    assert type(spec) is pytree.TreeSpec and spec == expected and spec.num_leaves == 3
    assert pytree.tree_unflatten([1, 2, 3], spec) == (1, [2, 3])


def adds_to_every_leaf(x, tree):
    return pytree.tree_map(lambda t: t + x, tree)


def test_a_new_tree_structure_compiles_again_and_the_same_one_does_not():
    counter = CompileCounter()
    compiled = framejit.compile(adds_to_every_leaf, backend=counter)
    x = torch.randn(2)
    trees = [{"a": torch.randn(2)}, {"a": torch.randn(2)}, {"b": torch.randn(2)},
             [torch.randn(2)], {"a": torch.randn(2)}]
    counts = []
    for tree in trees:
        assert same(compiled(x, tree), adds_to_every_leaf(x, tree))
        counts.append(counter.frame_count)
    assert counts == [1, 1, 2, 3, 3]


def test_a_class_registered_as_a_node_after_the_compile_compiles_again():
    @dataclasses.dataclass
    class Box:
        value: torch.Tensor

    def maps_a_box(x, box):
        return pytree.tree_map(lambda t: t * 2 if isinstance(t, torch.Tensor) else t, {"box": box, "x": x})

    counter = CompileCounter()
    compiled = framejit.compile(maps_a_box, backend=counter)
    x, box = torch.randn(2), Box(torch.randn(2))
    out = compiled(x, box)  # Box is a leaf: passed through as it is
    assert out["box"] is box and torch.equal(out["x"], x * 2) and counter.frame_count == 1
    pytree.register_dataclass(Box)
    try:
        out = compiled(x, box)  # now a node: its field is mapped
        assert type(out["box"]) is Box and torch.equal(out["box"].value, box.value * 2)
        assert counter.frame_count == 2
    finally:
        pytree._deregister_pytree_node(Box)


def checks_an_iterator(x):
    it = map(lambda t: t * 2, [x, x])
    import collections.abc
    return (x + 1, isinstance(it, (list, tuple)), isinstance(it, collections.abc.Iterator),
            isinstance(iter([x]), collections.abc.Iterable))


T = typing.TypeVar("T")


def annotates_a_callable(x):
    def apply(fn: typing.Callable[[T], typing.Any], value: T):
        return fn(value)

    import collections.abc
    return apply(lambda t: t * 2, x), collections.abc.Callable[[int], str]


def reads_a_namedtuples_class(x):
    pair = Pair(x, x + 1)
    return pair.first * len(type(pair)._fields)


def test_isinstance_of_iterators_callable_annotations_and_a_namedtuples_class_are_one_graph():
    x = torch.randn(3)
    for fn in (checks_an_iterator, annotates_a_callable, reads_a_namedtuples_class):
        counter = CompileCounter()
        assert same(framejit.compile(fn, backend=counter)(x), fn(x)), fn.__name__
        assert counter.frame_count == 1 and [r["exit"] for r in regions(fn)] == ["return"], fn.__name__


def test_pytree_called_by_untraced_code_compiles_nothing():
    # torch's internals call pytree all the time (vmap flattens its inputs with it): inlined
    # where traced code calls it, it is never a frame of its own.
    def runs_torch_internals(x):
        out = torch.func.vmap(lambda t: t * 2)(x)  # torch.func is not traced: a call at a break
        return out + 1

    from framejit import _C
    counter = CompileCounter()
    x = torch.randn(2, 3)
    assert same(framejit.compile(runs_torch_internals, backend=counter)(x), runs_torch_internals(x))
    assert counter.frame_count >= 1
    for fn in (pytree.tree_flatten, pytree.tree_unflatten, pytree.tree_map):
        assert _C.code_stats(fn)["regions"] == [], fn.__name__
