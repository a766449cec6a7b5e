"""framejit.explain: run a function once under framejit and report its graphs and breaks."""
import os
from dataclasses import dataclass, field
from typing import Any, List

from . import _C, backends, config


@dataclass
class RegionInfo:
    function: str
    filename: str
    entry_line: int
    entry_pc: int
    kind: str          # "compiled" or "fallback"
    exit: str          # "return", "branch", "call", "iterate", "with", "subscript", "deopt"
    exit_line: int
    reason: str        # why the region ended (empty for a return)
    graph_id: int      # -1: no graph (no tensor op in the region)
    graph_ops: int
    graph: str
    warmed: bool
    hits: int


@dataclass
class ExplainOutput:
    """What ``framejit.explain(fn)(*args)`` saw. ``str()`` of it is a readable report."""
    result: Any
    graphs: List[Any] = field(default_factory=list)  # the torch.fx.GraphModules, in order
    regions: List[RegionInfo] = field(default_factory=list)

    @property
    def graph_count(self) -> int:
        return len(self.graphs)

    @property
    def breaks(self) -> List[RegionInfo]:
        return [r for r in self.regions if r.exit != "return"]

    @property
    def graph_break_count(self) -> int:
        return len(self.breaks)

    @property
    def break_reasons(self) -> List[str]:
        return [r.reason for r in self.breaks]

    def __str__(self) -> str:
        lines = [f"Graph count: {self.graph_count}",
                 f"Graph break count: {self.graph_break_count}",
                 f"Region count: {len(self.regions)}"]
        if self.breaks:
            lines.append("Break reasons:")
            for i, region in enumerate(self.breaks, 1):
                lines.append(f"  {i}. [{region.exit}] {region.reason}")
        lines.append("Regions:")
        for region in self.regions:
            graph = (f"__compiled_fn_{region.graph_id} ({region.graph_ops} ops)"
                     if region.graph_id >= 0 else "no graph")
            warmed = ", compiled ahead by warm_branches" if region.warmed else ""
            lines.append(f"  {region.function} ({os.path.basename(region.filename)}:"
                         f"{region.entry_line}) -> {region.exit} at line {region.exit_line}, "
                         f"{region.kind}, {graph}, ran {region.hits}x{warmed}")
        for region in self.regions:
            if region.graph_id >= 0:
                lines.append(f"__compiled_fn_{region.graph_id}:")
                lines.extend("    " + line for line in region.graph.rstrip().splitlines())
        return "\n".join(lines)


def explain(fn, *, backend="eager", warm_branches=False, options=None):
    """``framejit.explain(fn)(*args, **kwargs)`` runs fn once, compiled afresh (nothing cached
    by earlier compiles is reused), and returns an :class:`ExplainOutput`."""
    options = dict(options or {})
    recompile_limit = int(options.get("recompile_limit", config.recompile_limit))
    inner, name = backends.lookup(backend)

    def run(*args, **kwargs):
        graphs, events = [], []

        def recording(gm, example_inputs):
            graphs.append(gm)
            return inner(gm, example_inputs)

        compiled = _C.make_compiled(fn, recording, name, False, recompile_limit,
                                    bool(warm_branches), events.append)
        result = compiled(*args, **kwargs)
        hits = {}
        for code in {id(e["code"]): e["code"] for e in events}.values():
            for region in _C.code_stats(code)["regions"]:
                hits[region["id"]] = region["hits"]
        regions = [RegionInfo(
            function=e["code"].co_qualname, filename=e["code"].co_filename,
            entry_line=e["entry_line"], entry_pc=e["entry_pc"], kind=e["kind"], exit=e["exit"],
            exit_line=e["exit_line"], reason=e["reason"] if e["exit"] != "return" else "",
            graph_id=e["graph_id"], graph_ops=e["graph_ops"], graph=e["graph"],
            warmed=e["warmed"], hits=hits.get(e["id"], 0)) for e in events]
        return ExplainOutput(result=result, graphs=graphs, regions=regions)

    return run
