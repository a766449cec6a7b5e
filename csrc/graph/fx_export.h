// Export of the IR to a torch.fx.Graph: what a backend sees when it reads gm.graph.
#pragma once

#include "common/py.h"
#include "graph/graph.h"

namespace framejit {

// A new torch.fx.Graph of `graph` (placeholders in order, one tuple output). Each FX node
// carries meta["example_value"] (the fake value). Raises py::error_already_set.
py::object export_fx_graph(const Graph& graph);

}  // namespace framejit
