// Runs a traced graph straight from the IR: the forward of the GraphModule a backend receives
// until someone asks for its FX form (python/framejit/_graph_module.py).
//
// Building a torch.fx.Graph, generating its Python source and compiling that source cost about
// two thirds of a compile when every graph got them up front. Most backends never look: the
// eager backend and any backend returning gm.forward only call it. So the graph stays in the IR,
// this runner executes it (each node's callable by vectorcall, values released after their last
// use, as FX's generated code does), and the FX graph is built only on first access.
#pragma once

#include <memory>

#include "common/py.h"
#include "graph/graph.h"

namespace framejit {

// Creates the runner type (framejit._C.GraphRunner); call once at module init. New reference.
PyObject* make_graph_runner_type();

// A new runner that owns `graph` (its placeholders in order are the inputs, its output node one
// tuple). Called as runner(module, *inputs): the module argument is ignored, so the runner works
// as a method (it binds like a function when stored on a class). Returns New or NULL.
PyObject* new_graph_runner(std::unique_ptr<Graph> graph);

// The runner's graph exported to a new torch.fx.Graph (each node with meta["example_value"]).
// Borrowed: runner. Raises py::error_already_set.
py::object runner_fx_graph(PyObject* runner);

}  // namespace framejit
