// co_extra storage of CodeState, the registry used by reset(), and the skip rules.
#include "runtime/code_state.h"

#include <algorithm>
#include <unordered_set>

#include <fmt/format.h>

#include "common/check.h"
#include "log/log.h"
#include "runtime/eval_frame.h"
#include "runtime/runtime_state.h"

namespace framejit {

namespace {


// Called by CPython when a code object dies (its co_extra slot is freed). GIL held.
void free_code_state(void* ptr) {
  auto* state = static_cast<CodeState*>(ptr);
  runtime_state().registry.erase(state);
  delete state;
}

Py_ssize_t extra_index() {
  Py_ssize_t& index = runtime_state().extra_index;
  if (index < 0) {
    index = fj_code_extra_index(free_code_state);
    FJ_CHECK(index >= 0, "no co_extra index available");
  }
  return index;
}

class RuntimeTraceHost final : public TraceHost {
 public:
  bool traces_into(PyCodeObject* code) override { return !should_skip_code(code, false); }
  const Bytecode& bytecode_of(PyCodeObject* code) override {
    return decoded_bytecode(code, *code_state(code));
  }
};

bool starts_with(const std::string& text, const std::string& prefix) {
  return text.compare(0, prefix.size(), prefix) == 0;
}

}  // namespace

CodeState* find_code_state(PyCodeObject* code) {
  void* extra = nullptr;
  if (fj_code_get_extra(code, extra_index(), &extra) < 0) {
    PyErr_Clear();
    return nullptr;
  }
  return static_cast<CodeState*>(extra);
}

CodeState* code_state(PyCodeObject* code) {
  CodeState* state = find_code_state(code);
  if (state != nullptr) return state;
  state = new CodeState();
  if (fj_code_set_extra(code, extra_index(), state) < 0) {
    PyErr_Clear();
    delete state;
    throw InternalError("setting the code object's extra slot failed");
  }
  runtime_state().registry.insert(state);
  return state;
}

void reset_all_code_states() {
  RuntimeState& rs = runtime_state();
  for (CodeState* state : rs.registry) {
    state->decision = CodeState::Decision::kUnknown;
    // A thread may be running these regions right now (reset() from another thread, or from
    // code a compiled function calls): they are retired, and freed once no compiled call runs.
    for (auto& region : state->take_regions()) rs.retired.emplace_back(std::move(region));
    if (state->bytecode) rs.retired.emplace_back(std::move(state->bytecode));
    state->limit_warned = false;
  }
  if (rs.active_threads == 0) rs.retired.clear();
}

void reset_skip_decisions() {
  for (CodeState* state : runtime_state().registry) state->decision = CodeState::Decision::kUnknown;
}

void set_trace_rules(const std::vector<std::pair<std::string, int>>& given) {
  std::vector<std::pair<std::string, TraceRule>> rules;
  for (const auto& [prefix, rule] : given) {
    FJ_CHECK(rule >= 0 && rule <= 2, "trace rule {} for {} is not 0, 1 or 2", rule, prefix);
    rules.emplace_back(prefix, static_cast<TraceRule>(rule));
  }
  std::stable_sort(rules.begin(), rules.end(), [](const auto& a, const auto& b) {
    return a.first.size() > b.first.size();
  });
  runtime_state().path_rules = std::move(rules);
  reset_skip_decisions();
}

void allow_code(py::object code) {
  std::vector<py::object>& codes = runtime_state().allow_codes;
  for (const auto& known : codes) {
    if (known.ptr() == code.ptr()) return;
  }
  codes.push_back(std::move(code));
  reset_skip_decisions();
}

bool should_skip_code(PyCodeObject* code, bool as_frame) {
  // A generator's frame is never hooked (it runs across calls); a generator function called
  // in the trace is run by the tracer (trace/generators.cpp). Coroutines are never traced.
  constexpr int kNeverTraced = CO_COROUTINE | CO_ASYNC_GENERATOR | CO_ITERABLE_COROUTINE;
  if (code->co_flags & kNeverTraced) return true;
  if (as_frame && (code->co_flags & CO_GENERATOR)) return true;
  if (!(code->co_flags & CO_OPTIMIZED) || !(code->co_flags & CO_NEWLOCALS)) return true;
  const char* name = PyUnicode_AsUTF8(code->co_filename);
  if (name == nullptr) {
    PyErr_Clear();
    return true;
  }
  const std::string filename = name;
  if (filename.empty()) return true;
  const RuntimeState& rs = runtime_state();
  // framejit's own Python forms and the helpers they call: inlined where the trace calls them,
  // never hooked as frames of their own (one that escapes the trace, a manager made in it, runs
  // as plain Python like the rest of framejit).
  for (const auto& known : rs.allow_codes) {
    if (known.ptr() == reinterpret_cast<PyObject*>(code)) return as_frame;
  }
  for (const auto& [prefix, rule] : rs.path_rules) {
    if (starts_with(filename, prefix)) {
      return rule == TraceRule::kSkip || (as_frame && rule == TraceRule::kInlineOnly);
    }
  }
  // Frozen modules (importlib & co.) are not traced, unless a rule names one
  // ("<frozen _collections_abc>": a traced part of the standard library, frozen on 3.11+).
  return starts_with(filename, "<frozen");
}

const Bytecode& decoded_bytecode(PyCodeObject* code, CodeState& state) {
  if (!state.bytecode) {
    state.bytecode = Bytecode::from_code(code);
    if (log_enabled(Artifact::bytecode)) {
      const char* file = PyUnicode_AsUTF8(code->co_filename);
      const char* name = PyUnicode_AsUTF8(code->co_qualname);
      if (!file || !name) PyErr_Clear();
      log_emit(Artifact::bytecode,
               fmt::format("BYTECODE {} ({}:{})\n{}", name ? name : "?", file ? file : "?",
                           code->co_firstlineno, state.bytecode->to_string()));
    }
  }
  return *state.bytecode;
}

TraceHost& runtime_trace_host() {
  static RuntimeTraceHost host;
  return host;
}

}  // namespace framejit
