"""The seed example: a function that branches on a tensor's value, compiled with framejit.

Run with FRAMEJIT_LOGS=graph_code to see the graphs (the README's demo command does).
framejit cannot break a graph at `if x.mean() > 0.5` yet (that is the regions work), so this
frame runs in plain Python and the log says why; the straight-line helper below compiles to one
graph.
"""
import torch

import framejit
from framejit.testing import CompileCounter, regions, same


def my_function(inputs):
    x = inputs["x"]
    y = inputs["y"]
    x = torch.add(x, 0.5)
    if x.mean() > 0.5:
        x = x / 1.1
    return x * y


def straight_line(inputs):
    x = inputs["x"]
    y = inputs["y"]
    x = torch.add(x, 0.5)
    return x * y, x.mean() > 0.5


def main() -> None:
    if not framejit._logging.enabled():
        framejit.set_logs("graph_code", "graph_breaks")
    torch.manual_seed(0)
    counter = CompileCounter()
    inputs_true = {"x": torch.rand(4, 4) + 0.5, "y": torch.rand(4, 4)}
    inputs_false = {"x": torch.rand(4, 4) - 1.0, "y": torch.rand(4, 4)}

    print("== seed function (branch on x.mean() > 0.5) ==")
    compiled = framejit.compile(my_function, backend=counter)
    for name, inputs in (("true branch", inputs_true), ("false branch", inputs_false)):
        ok = same(compiled(inputs), my_function(inputs))
        print(f"{name}: equal to eager: {ok}")
    for region in regions(compiled):
        print(f"region: {region['kind']}, hits={region['hits']}, reason: {region['reason']}")

    print("\n== straight-line part of it ==")
    compiled_line = framejit.compile(straight_line, backend=counter)
    for name, inputs in (("first call", inputs_true), ("second call", inputs_false)):
        ok = same(compiled_line(inputs), straight_line(inputs))
        print(f"{name}: equal to eager: {ok}")
    print(f"graphs compiled in total: {counter.frame_count}")


if __name__ == "__main__":
    main()
