// The exit builder: turns the abstract values alive at a region's exit (the result, the locals
// it wrote, the value stack, attribute writes) into Rebuild descriptions over graph outputs,
// sources and constants, collecting the graph outputs they need.
#pragma once

#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "graph/graph.h"
#include "region/exit.h"
#include "trace/side_effects.h"
#include "trace/value.h"

namespace framejit {

class ExitBuilder {
 public:
  RegionExit& exit() { return exit_; }

  // How to rebuild `value` after the graph ran: an entry value passed on unchanged is read again
  // from its source; a tensor is a graph output (added once); containers, objects made in the
  // trace, iterators, cells and numbers are rebuilt from their parts.
  Rebuild rebuild_of(const ValuePtr& value);
  // The attribute and global writes to replay at the exit, in program order, then the contents
  // of the lists and dicts read by source that the trace changed.
  void add_writes(const SideEffects& effects);
  // The graph outputs the rebuilds refer to (the graph's output node takes them).
  std::vector<Arg> take_outputs() { return std::move(outputs_); }

 private:
  Rebuild memoised(Rebuild r, const ValuePtr& value);
  // A real iterator in the state the trace left `it` in, of the type Python's would have.
  Rebuild iterator_rebuild(const ValuePtr& it);

  static constexpr int kMaxDepth = 2000;
  int depth_ = 0;  // rebuild_of's nesting
  RegionExit exit_;
  std::vector<Arg> outputs_;
  std::unordered_map<Node*, int> output_index_;
  std::unordered_set<const Value*> filled_cells_;  // recursive functions' cells given their write
};

}  // namespace framejit
