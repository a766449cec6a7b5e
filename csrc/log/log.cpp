// Log artifacts: a bit mask for the fast "is it on" test, Python logging for the output.
#include "log/log.h"

#include "common/pause.h"
#include "common/py.h"
#include "trace/pyrefs.h"

namespace framejit {

const char* artifact_name(Artifact artifact) {
  switch (artifact) {
#define FJ_ARTIFACT_NAME(name, bit) \
  case Artifact::name:              \
    return #name;
    FJ_FOREACH_ARTIFACT(FJ_ARTIFACT_NAME)
#undef FJ_ARTIFACT_NAME
  }
  return "?";
}

void set_log_mask(uint32_t mask) { log_state().mask = mask; }

bool log_enabled(Artifact artifact) {
  return (log_state().mask & static_cast<uint32_t>(artifact)) != 0;
}

void log_emit(Artifact artifact, const std::string& message) {
  if (!log_enabled(artifact)) return;
  PauseScope pause;  // the user's logging handlers run as plain Python, never traced
  try {
    PyRefs::get().support.attr("emit")(artifact_name(artifact), message);
  } catch (const py::error_already_set&) {
    PyErr_Clear();
  }
}

void warn(const std::string& message) {
  PauseScope pause;  // warning filters and logging handlers run as plain Python
  try {
    PyRefs::get().support.attr("warn")(message);
  } catch (const py::error_already_set&) {
    PyErr_Clear();
  }
}

}  // namespace framejit
