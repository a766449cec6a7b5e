"""The GraphModule a backend receives: a torch.fx.GraphModule whose FX form is made on demand.

Until something asks for it, the graph lives only in framejit's C++ IR and ``forward`` is a
``framejit._C.GraphRunner``: it calls each node's target by vectorcall and drops values after
their last use, as FX's generated code does, without generating or compiling any code. Building
the ``torch.fx.Graph``, generating its Python source and compiling that cost about two thirds of
a compile when they ran for every graph, and most backends never look at them (``eager`` and any
backend that returns ``gm.forward``).

The first read of ``graph``, ``code``, any FX attribute, ``recompile()``, copying or pickling
builds the FX graph from the IR and turns the module into an ordinary GraphModule (FX's own
``forward``); nothing observable differs from one built eagerly, except the time it took.
"""
import torch
from torch.fx import GraphModule
from torch.fx._lazy_graph_module import _LazyGraphModule

# GraphModule state that only exists once the FX graph does; reading any of it materialises.
_FX_STATE = frozenset({
    "_graph", "_code", "_lineno_map", "_prologue_start", "_tracer_cls", "_tracer_extras",
    "_replace_hooks", "_create_node_hooks", "_erase_node_hooks", "_deepcopy_hooks", "shape_env",
})


class FramejitGraphModule(_LazyGraphModule):
    """A GraphModule (``isinstance(gm, torch.fx.GraphModule)``) made lazily from framejit's IR.

    It is a ``_LazyGraphModule`` so that torch's own callers that need real code first
    (``torch.fx.Tracer.trace``, inductor) call ``force_recompile`` -> ``real_recompile``, which
    materialises it. ``torch.jit.script`` needs ``gm.recompile()`` first, as for any lazy
    GraphModule."""

    def __new__(cls, *args, **kwargs):
        # GraphModule.__new__ makes a class for each instance (FX sets the generated forward on
        # it), which costs more than the rest of this module: it is made on materialisation.
        # A copy of a materialised module (deepcopy calls type(gm).__new__) gets its own.
        if cls is not FramejitGraphModule:
            cls = _instance_class(FramejitGraphModule)
        return torch.nn.Module.__new__(cls)

    def __init__(self, runner, name: str):
        # GraphModule.__init__ would build and compile the FX graph now: only nn.Module's state.
        torch.nn.Module.__init__(self)
        self.meta = {"framejit_name": name}
        self._framejit_runner = runner
        # forward is the runner bound to this module (it binds like a function), held by the
        # instance until materialisation gives the module FX's generated forward.
        self.__dict__["forward"] = runner.__get__(self, type(self))

    # -- materialisation ----------------------------------------------------------------------

    def _framejit_materialise(self, recompile: bool = True):
        """Builds the FX graph and the state GraphModule.__init__ would have set."""
        runner = self.__dict__.get("_framejit_runner")
        if runner is None:
            return
        fx_graph = runner.fx_graph()
        self._tracer_cls = None
        self._tracer_extras = {}
        self._replace_hooks = []
        self._create_node_hooks = []
        self._erase_node_hooks = []
        self._deepcopy_hooks = []
        self.shape_env = None
        del self.__dict__["_framejit_runner"]
        forward = self.__dict__.get("forward")
        if getattr(forward, "__func__", None) is runner:  # not a forward someone set since
            del self.__dict__["forward"]
        self.__class__ = _instance_class(type(self))
        self._graph = fx_graph
        fx_graph.owning_module = self
        if recompile:
            GraphModule.recompile(self)  # sets FX's generated forward on this instance's class

    def __getattr__(self, name):
        if name in _FX_STATE and "_framejit_runner" in self.__dict__:
            self._framejit_materialise()
            return getattr(self, name)
        return super().__getattr__(name)

    @property
    def graph(self):
        self._framejit_materialise()
        return self._graph

    @graph.setter
    def graph(self, g):
        self._framejit_materialise(recompile=False)
        GraphModule.graph.fset(self, g)

    def recompile(self):
        # Eager, as GraphModule's (a _LazyGraphModule only marks itself): returns PythonCode.
        return self._real_recompile()

    def real_recompile(self):
        if "_framejit_runner" in self.__dict__:
            self._framejit_materialise()
        else:
            super().real_recompile()

    def _real_recompile(self):
        # _LazyGraphModule's code, __str__, __reduce__ and lazy forward all come through here.
        self._framejit_materialise(recompile=False)
        return GraphModule.recompile(self)

    def __deepcopy__(self, memo):
        self._framejit_materialise()
        return GraphModule.__deepcopy__(self, memo)

    def __copy__(self):
        self._framejit_materialise()
        return GraphModule.__copy__(self)


# The class GraphModule.__new__ would have made for one instance: FX's recompile sets the
# generated forward on it, so each materialised module needs its own.
def _instance_class(cls):
    impl = type("GraphModuleImpl", (cls,), {})
    impl.__name__ = "GraphModule"  # what repr() and FX's printed code call it
    return impl


FramejitGraphModule.__name__ = "GraphModule"  # as above, before materialisation
