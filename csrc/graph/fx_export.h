// Export of the IR to a torch.fx.GraphModule: the torch.compile backend contract.
#pragma once

#include "common/py.h"
#include "graph/graph.h"

namespace framejit {

// A new GraphModule whose code runs `graph` (placeholders in order, one tuple output).
// Each FX node carries meta["example_value"] (the fake value). Raises py::error_already_set.
py::object export_fx(const Graph& graph);

}  // namespace framejit
