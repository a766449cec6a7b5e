"""collections.deque made in the trace: a list of the trace with a deque's methods and maxlen,
rebuilt as a deque where it leaves the region (torch.compile traces them too). Each test
compares with eager and counts graphs."""
import collections
import contextlib

import pytest
import torch

import framejit
from framejit.testing import CompileCounter, regions, same


def one_graph(fn, *args):
    counter = CompileCounter()
    compiled = framejit.compile(fn, backend=counter)
    for _ in range(2):
        out, ref = compiled(*args), fn(*args)
        assert type(out) is type(ref)
        if isinstance(ref, collections.deque):
            assert ref.maxlen == out.maxlen
            out, ref = list(out), list(ref)
        assert same(out, ref)
    assert counter.frame_count == 1
    assert all(r["exit"] == "return" for r in regions(fn))
    return counter


def bounded(x):
    dq = collections.deque(maxlen=2)
    for i in range(3):
        dq.append(x * i)
    dq.appendleft(x)
    return sum(dq)


def rotated(x):
    dq = collections.deque([x, x + 1, x + 2])
    dq.rotate(1)
    first = dq.popleft()
    dq.extendleft([x * 5, x * 6])
    last = dq.pop()
    dq.extend(t * 2 for t in (x, x))
    dq.rotate(-2)
    return first + last + dq[0] + dq[-1] + len(dq) + collections.deque([1, 2, 2]).count(2)


def returned(x):
    dq = collections.deque([x, x * 2, x * 3], maxlen=3)
    dq.append(x * 4)
    dq.reverse()
    return dq


def copied(x):
    dq = collections.deque([x], maxlen=4)
    other = dq.copy()
    other.append(x + 1)
    return (2 in collections.deque([1, 2])) * x + len(dq) + len(other) + other[1]


def list_methods(x):
    # (a list's methods that a deque shares: the same code)
    dq = collections.deque([1, 2, 3, 2], maxlen=5)
    dq.remove(2)
    dq.insert(1, 7)
    at = dq.index(3)
    dq.reverse()
    kept = tuple(dq)
    dq.clear()
    return x * (at + dq.count(2)) + len(dq), kept


@pytest.mark.parametrize("fn", [bounded, rotated, returned, copied, list_methods])
def test_deque_made_in_the_trace_is_one_graph(fn):
    one_graph(fn, torch.randn(3))


def sliced(x):
    dq = collections.deque([x, x])
    return dq[0:1]


def test_a_slice_of_a_deque_raises_pythons_type_error():
    compiled = framejit.compile(sliced, backend=CompileCounter())
    with pytest.raises(TypeError):
        compiled(torch.randn(2))


def inserts_into_a_full_deque(x):
    dq = collections.deque([x, x], maxlen=2)
    dq.insert(0, x)
    return dq[0]


def test_an_insert_into_a_full_deque_raises_pythons_index_error():
    compiled = framejit.compile(inserts_into_a_full_deque, backend=CompileCounter())
    with pytest.raises(IndexError):
        compiled(torch.randn(2))


calls = []


def exit_stack(x):
    with contextlib.ExitStack() as stack:  # (its __init__ makes a deque)
        stack.callback(calls.append, "done")
        y = x * 2
    return y


def test_exit_stack_runs_its_callbacks_as_in_eager():
    del calls[:]
    compiled = framejit.compile(exit_stack, backend=CompileCounter())
    x = torch.randn(2)
    assert same(compiled(x), exit_stack(x)) and calls == ["done", "done"]
