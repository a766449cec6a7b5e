// The real grad mode and in-graph mode blocks while a trace runs.
#include "trace/mode_stack.h"

#include "common/check.h"
#include "trace/pyrefs.h"

namespace framejit {

bool ModeStack::grad_enabled() {
  return PyRefs::get().torch.attr("is_grad_enabled")().cast<bool>();
}

void ModeStack::remember_grad() {
  if (!grad_at_start_) grad_at_start_ = grad_enabled();
}

void ModeStack::set_grad_enabled(bool enabled) {
  remember_grad();
  PyRefs::get().torch.attr("_C").attr("_set_grad_enabled")(enabled);
}

void ModeStack::open_block(CallSite site, py::object leave, py::object context) {
  blocks_.push_back({site, std::move(leave), std::move(context)});
}

py::object ModeStack::close_block(py::handle context) {
  FJ_CHECK(!blocks_.empty() && blocks_.back().context.is(context),
           "inference_mode / autocast blocks exited out of order");
  py::object leave = std::move(blocks_.back().leave);
  py::object entered = std::move(blocks_.back().context);
  blocks_.pop_back();
  leave(entered);
  return leave;
}

void ModeStack::restore() {
  while (!blocks_.empty()) {  // innermost first
    blocks_.back().leave(blocks_.back().context);
    blocks_.pop_back();
  }
  if (!grad_at_start_) return;
  PyRefs::get().torch.attr("_C").attr("_set_grad_enabled")(*grad_at_start_);
  grad_at_start_.reset();
}

}  // namespace framejit
