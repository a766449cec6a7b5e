// Named log artifacts (FRAMEJIT_LOGS / TORCH_LOGS), emitted through Python's logging.
#pragma once

#include <cstdint>
#include <string>

namespace framejit {

// The one list of artifacts; the Python side (framejit/_logging.py) uses the same names & bits.
#define FJ_FOREACH_ARTIFACT(V) \
  V(graph_code, 0)             \
  V(guards, 1)                 \
  V(recompiles, 2)             \
  V(bytecode, 3)               \
  V(graph_breaks, 4)           \
  V(regions, 5)                \
  V(output_code, 6)

enum class Artifact : uint32_t {
#define FJ_ARTIFACT_ENUM(name, bit) name = 1u << bit,
  FJ_FOREACH_ARTIFACT(FJ_ARTIFACT_ENUM)
#undef FJ_ARTIFACT_ENUM
};

const char* artifact_name(Artifact artifact);

// The log layer's process-wide state: its part of the one module state (csrc/module_state.h).
struct LogState {
  uint32_t mask = 0;  // the artifacts on, one bit each
};
LogState& log_state();

void set_log_mask(uint32_t mask);
bool log_enabled(Artifact artifact);

// Sends `message` to the logger framejit.<artifact> if that artifact is on. Callers that build
// costly messages test log_enabled() first. Needs the GIL; never throws.
void log_emit(Artifact artifact, const std::string& message);

// Emits a FramejitWarning (a UserWarning) through Python's warnings module, and the same text to
// the `framejit` logger. Needs the GIL; never throws.
void warn(const std::string& message);

}  // namespace framejit
