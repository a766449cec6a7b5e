// Whether framejit's own code is running on this thread (tracing, backends, graphs, logging,
// disable()): frames started then run in plain CPython, never through the hook. Kept at the
// bottom layer so that every layer can pause the hook around Python it calls (the logs call
// the user's logging handlers).
#pragma once

namespace framejit {

// > 0 while framejit's own code runs on this thread. Per thread, not process-wide state.
inline int& hook_pause_depth() {
  static thread_local int depth = 0;
  return depth;
}

// Frames started inside this scope run in plain CPython.
class PauseScope {
 public:
  PauseScope() { ++hook_pause_depth(); }
  ~PauseScope() { --hook_pause_depth(); }
  PauseScope(const PauseScope&) = delete;
  PauseScope& operator=(const PauseScope&) = delete;
};

}  // namespace framejit
