// The frame runtime's entry points besides the hook itself (fj_on_frame in eval_frame.h).
#pragma once

namespace framejit {

// How many graphs have been handed to a backend since import (ids of __compiled_fn_N).
int graphs_compiled();

}  // namespace framejit
