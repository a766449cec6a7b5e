// Grad mode, inference mode and autocast inside one graph (grad_mode.cpp): the handlers for the
// mode managers a trace makes and enters. Their state is the tracer's ModeStack.
#pragma once

#include <vector>

#include "common/py.h"
#include "trace/value.h"

namespace framejit {

class Tracer;

// torch.no_grad() / torch.enable_grad() (`cls`) made in the trace: no effect until entered.
ValuePtr make_grad_mode_manager(py::handle cls);
// torch.set_grad_enabled(mode): switches at once (it is also a context manager).
ValuePtr set_grad_enabled_call(Tracer& t, const std::vector<ValuePtr>& args);
// torch.inference_mode(mode) and torch.autocast(...) with arguments known at trace time.
ValuePtr inference_mode_call(const std::vector<ValuePtr>& args, const KwValues& kwargs);
ValuePtr autocast_call(const std::vector<ValuePtr>& args, const KwValues& kwargs);
// A context manager whose block holds nothing for the graph (`cls`: a profiler range, which the
// graph does not record, as under torch.compile; contextlib.nullcontext(enter_result)).
ValuePtr null_context_call(py::handle cls, const std::vector<ValuePtr>& args, const KwValues& kwargs);
// BEFORE_WITH on a mode manager of the trace: records the switch and pushes [__exit__, None].
void enter_with(Tracer& t, const ValuePtr& manager);
// The __exit__ of such a block called (with no exception).
ValuePtr exit_with(Tracer& t, const ValuePtr& exit, const std::vector<ValuePtr>& args);
// A region may not end inside an in-graph inference_mode / autocast block: throws InlineBreak
// (the trace is redone with that block left to the runtime) when one is open.
void check_no_open_mode_block(Tracer& t, const std::string& why);

}  // namespace framejit
