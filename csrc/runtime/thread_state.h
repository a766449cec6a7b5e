// Per-thread hook state: which compile context is active, and whether framejit itself is running.
#pragma once

#include <cstddef>

#include "common/pause.h"
#include "runtime/code_state.h"

namespace framejit {

struct ThreadState {
  CompileContext* ctx = nullptr;  // borrowed from the innermost running compiled function
  std::shared_ptr<CompileContext> ctx_owner;
};

ThreadState& thread_state();

// Bytes of C stack left below the caller on this thread (SIZE_MAX if unknown).
size_t c_stack_left();
// Under this much, frames run in plain CPython; under the reserve, a call raises RecursionError.
inline constexpr size_t kStackForTracing = 512 * 1024;
inline constexpr size_t kStackReserve = 128 * 1024;
// CPython 3.12 also counts C recursion (each evaluator entry and C-level call), with a limit
// of its own that eager's inlined Python calls never reach but hooked ones, each a C call, do:
// below this many units left a frame runs with the hook off, like the C stack above.
inline constexpr int kCallsForTracing = 400;

// Entered by a compiled function's call: turns the hook on for this thread (installing it on
// the interpreter when the first thread enters) and makes `ctx` the active context.
class ActiveScope {
 public:
  explicit ActiveScope(const std::shared_ptr<CompileContext>& ctx);
  ~ActiveScope();
  ActiveScope(const ActiveScope&) = delete;
  ActiveScope& operator=(const ActiveScope&) = delete;

 private:
  std::shared_ptr<CompileContext> prev_;
  int prev_paused_;
};

}  // namespace framejit
