// The mode stack: the thread's real grad mode, and the in-graph inference_mode / autocast blocks
// open while the trace runs. The body of a traced `with torch.no_grad()` (and friends) is traced
// under the real mode it sets, so meta results get eager's requires_grad and dtypes; whatever the
// trace switched is put back when it ends.
#pragma once

#include <optional>
#include <utility>
#include <vector>

#include "common/py.h"
#include "trace/retrace.h"

namespace framejit {

class ModeStack {
 public:
  ModeStack() = default;
  ModeStack(const ModeStack&) = delete;
  ModeStack& operator=(const ModeStack&) = delete;

  // Switches the real grad mode (remembering the mode the trace started with).
  void set_grad_enabled(bool enabled);
  // Remembers the grad mode the trace started with, before something else switches it.
  void remember_grad();
  static bool grad_enabled();

  // Whether `with torch.inference_mode()` may be entered inside a graph: only for framejit's
  // own backends. Others (inductor's AOT trace cannot functionalise a graph that makes inference
  // tensors: torch.compile fails there) get the block entered by the runtime between regions.
  void set_inference_in_graph(bool allowed) { inference_in_graph_ = allowed; }
  bool inference_in_graph() const { return inference_in_graph_; }

  // An in-graph block (inference_mode, autocast) entered at `site`: `leave(context)` leaves it.
  void open_block(CallSite site, py::object leave, py::object context);
  bool in_block() const { return !blocks_.empty(); }
  // The site of the innermost open block (in_block() only).
  const CallSite& innermost_site() const { return blocks_.back().site; }
  // Leaves the innermost block, which must be the one that gave `context`: calls its leave
  // function and returns it (for the graph's exit node).
  py::object close_block(py::handle context);

  // Leaves every open block (innermost first) and restores the grad mode the trace started
  // with. Called however the trace ends.
  void restore();

 private:
  struct Block {
    CallSite site;
    py::object leave;
    py::object context;  // what the block's enter returned at trace time
  };
  std::optional<bool> grad_at_start_;  // set once the trace switched the real grad mode
  bool inference_in_graph_ = true;
  std::vector<Block> blocks_;          // innermost last
};

}  // namespace framejit
