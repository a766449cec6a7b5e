"""The seed example: a function that branches on a tensor's value, compiled with framejit.

    FRAMEJIT_LOGS=graph_code,graph_breaks python3 examples/seed.py

The branch `if x.mean() > 0.5` ends the first region: its graph computes add, mean and gt, the
runtime tests the condition, and each side of the branch is a region of its own (one graph per
tail). Without warm_branches the side not yet taken compiles when first taken; with
warm_branches=True both compile at the first call, so a warm-up covers every case.
"""
import torch

import framejit
from framejit.testing import CompileCounter, same


def my_function(inputs):
    x = inputs["x"]
    y = inputs["y"]
    x = torch.add(x, 0.5)
    if x.mean() > 0.5:
        x = x / 1.1
    return x * y


def run(warm_branches: bool) -> None:
    framejit.reset()
    counter = CompileCounter()
    compiled = framejit.compile(my_function, backend=counter, warm_branches=warm_branches)
    inputs_true = {"x": torch.rand(4, 4) + 0.5, "y": torch.rand(4, 4)}
    inputs_false = {"x": torch.rand(4, 4) - 1.0, "y": torch.rand(4, 4)}
    for name, inputs in (("true branch", inputs_true), ("false branch", inputs_false),
                         ("true branch again", inputs_true), ("false branch again", inputs_false)):
        before = counter.frame_count
        ok = same(compiled(inputs), my_function(inputs))
        print(f"  {name:<19} equal to eager: {ok}, graphs compiled by this call: "
              f"{counter.frame_count - before}", flush=True)
    print(f"  graphs in total: {counter.frame_count}", flush=True)


def main() -> None:
    torch.manual_seed(0)
    if not framejit._logging.enabled():
        framejit.set_logs("graph_code", "graph_breaks")
    print("== warm_branches=False: each tail compiles when first taken ==", flush=True)
    run(warm_branches=False)
    print("\n== warm_branches=True: the first call compiles every tail ==", flush=True)
    run(warm_branches=True)
    framejit.set_logs()  # quiet for the report below
    print("\n== framejit.explain(my_function, warm_branches=True)(inputs) ==", flush=True)
    report = framejit.explain(my_function, warm_branches=True)(
        {"x": torch.rand(4, 4) + 0.5, "y": torch.rand(4, 4)})
    print(report, flush=True)


if __name__ == "__main__":
    main()
