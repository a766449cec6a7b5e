// Prints a graph as readable Python, the way TORCH_LOGS=graph_code does, with the user's lines.
#pragma once

#include <functional>
#include <string>

#include "graph/graph.h"

namespace framejit {

// Returns the stripped source text of a line of the graph's file ("" if unknown).
using LineSource = std::function<std::string(int line)>;

// `def forward(self, x: "f32[2]"):` then one `name: "meta" = expr` line per node, with a
// `# File: path:line in fn, code: text` comment whenever the user's line changes.
std::string print_graph(const Graph& graph, const LineSource& line_source);

// A LineSource reading through Python's linecache (needs the GIL).
LineSource linecache_source(const std::string& filename);

// The printed form of one argument ("x", "0.5", "(a, b)", "[1, 2]").
std::string print_arg(const Arg& arg);

}  // namespace framejit
