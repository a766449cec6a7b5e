// framejit._C: the one pybind11 binding file. Everything here is glue to Python; logic lives in
// runtime/, trace/, graph/, guards/ and bytecode/.
#include "common/py.h"

#include <pybind11/stl.h>

#include "backends/native_function.h"
#include "bytecode/decode.h"
#include "graph/graph_runner.h"
#include "log/log.h"
#include "module_state.h"
#include "runtime/code_state.h"
#include "runtime/compiled_function.h"
#include "runtime/eval_frame.h"
#include "runtime/frame_runtime.h"
#include "trace/kinds.h"
#include "trace/pyrefs.h"
#include "trace/tracer.h"

namespace framejit {
namespace {

PyCodeObject* code_of(py::handle obj) {
  py::object target = py::reinterpret_borrow<py::object>(obj);
  if (py::hasattr(target, "_framejit_fn")) target = target.attr("_framejit_fn");
  if (PyMethod_Check(target.ptr())) target = target.attr("__func__");
  if (py::hasattr(target, "__code__")) target = target.attr("__code__");
  if (!PyCode_Check(target.ptr())) throw py::type_error("expected a function or code object");
  return reinterpret_cast<PyCodeObject*>(target.ptr());
}

const char* kind_name(RegionKind kind) {
  return kind == RegionKind::kCompiled ? "compiled" : "fallback";
}

py::dict code_stats(py::handle obj) {
  py::dict out;
  py::list regions;
  PyCodeObject* code = code_of(obj);
  CodeState* state = find_code_state(code);
  if (state != nullptr) {
    for (const auto& region : state->regions) {
      py::dict r;
      r["id"] = region->id;
      r["kind"] = kind_name(region->kind);
      r["entry_pc"] = region->entry_pc;
      r["entry_line"] = state->bytecode ? state->bytecode->at(region->entry_pc).line : -1;
      r["exit"] = exit_kind_name(region->exit.kind);
      r["exit_pc"] = region->exit.pc;
      r["graph_id"] = region->graph_id;
      r["graph_ops"] = region->graph_ops;
      r["graph"] = region->graph_text;
      r["guards"] = region->guards.to_string(region->sources);
      r["reason"] = region->kind == RegionKind::kFallback ? region->reason : region->exit.reason;
      r["warmed"] = region->warmed;
      r["hits"] = region->hits;
      r["result"] = region->exit.kind == ExitKind::kReturn ? region->exit.result.to_string()
                                                            : std::string();
      regions.append(r);
    }
    out["skipped"] = state->decision == CodeState::Decision::kSkip ||
                     state->decision == CodeState::Decision::kGivenUp;
  }
  out["regions"] = regions;
  return out;
}

}  // namespace
}  // namespace framejit

PYBIND11_MODULE(_C, m) {
  framejit::native::register_native(m);
  using namespace framejit;
  m.doc() = "framejit's C++ core: the frame hook, tracer, graph IR and guards.";

  py::object compiled_type = py::reinterpret_steal<py::object>(make_compiled_function_type());
  if (!compiled_type) throw py::error_already_set();
  m.attr("CompiledFunction") = compiled_type;
  py::object runner_type = py::reinterpret_steal<py::object>(make_graph_runner_type());
  if (!runner_type) throw py::error_already_set();
  m.attr("GraphRunner") = runner_type;

  // The kinds framejit._support answers in (trace/kinds.h): one definition for both halves.
#define FJ_PY_VALUE(name, py_name) .value(#py_name, Kind::name)
  {
    using Kind = CallableKind;
    py::enum_<Kind>(m, "CallableKind") FJ_FOREACH_CALLABLE_KIND(FJ_PY_VALUE);
  }
  {
    using Kind = AttrKind;
    py::enum_<Kind>(m, "AttrKind") FJ_FOREACH_ATTR_KIND(FJ_PY_VALUE);
  }
  {
    using Kind = Presence;
    py::enum_<Kind>(m, "Presence") FJ_FOREACH_PRESENCE(FJ_PY_VALUE);
  }
  {
    using Kind = TensorMethodKind;
    py::enum_<Kind>(m, "TensorMethodKind") FJ_FOREACH_TENSOR_METHOD_KIND(FJ_PY_VALUE);
  }
#undef FJ_PY_VALUE

  m.def(
      "_inject_fault",
      [](const std::string& site, int64_t n) {
        FaultInjection& fault = fault_injection();
        if (site == "none" || n <= 0) {
          fault = FaultInjection();
          return;
        }
        if (site == "trace") fault.site = FaultSite::kTrace;
        else if (site == "export") fault.site = FaultSite::kExport;
        else if (site == "backend") fault.site = FaultSite::kBackend;
        else throw py::value_error("fault site must be 'trace', 'export', 'backend' or 'none'");
        fault.countdown = n;
      },
      py::arg("site"), py::arg("n") = 1,
      "Tests only: the tracer, the export or the backend call fails at its n-th opportunity.");
  m.def("_fault_armed", []() { return fault_injection().site != FaultSite::kNone; });

  m.def("_init", [](py::object support) { PyRefs::init(std::move(support)); },
        "Connects the C++ core to framejit._support (called once by framejit/__init__.py).");

  m.def(
      "make_compiled_like",
      [](py::object compiled, py::object fn) {
        PyObject* out = compiled_function_with(compiled.ptr(), fn.ptr());  // New
        if (out == nullptr) throw py::error_already_set();
        return py::reinterpret_steal<py::object>(out);
      },
      py::arg("compiled"), py::arg("fn"),
      "A compiled wrapper of fn sharing compiled's backend, options and code cache.");
  m.def(
      "make_compiled",
      [compiled_type](py::object fn, py::object backend, std::string backend_name, bool fullgraph,
                      int recompile_limit, bool warm_branches, py::object on_region,
                      bool any_sizes, int dynamic, py::object entry_code) {
        static uint64_t next_context_id = 0;  // the GIL is held
        auto ctx = std::make_shared<CompileContext>();
        ctx->id = ++next_context_id;
        ctx->backend = std::move(backend);
        ctx->backend_name = std::move(backend_name);
        ctx->fullgraph = fullgraph;
        ctx->recompile_limit = recompile_limit;
        ctx->warm_branches = warm_branches;
        ctx->on_region = std::move(on_region);
        ctx->any_sizes = any_sizes;
        ctx->dynamic = dynamic;
        if (!entry_code.is_none()) ctx->entry_code = std::move(entry_code);
        PyObject* out = new_compiled_function(compiled_type.ptr(), fn.ptr(), std::move(ctx));
        if (out == nullptr) throw py::error_already_set();
        return py::reinterpret_steal<py::object>(out);
      },
      py::arg("fn"), py::arg("backend"), py::arg("backend_name"), py::arg("fullgraph"),
      py::arg("recompile_limit"), py::arg("warm_branches") = false,
      py::arg("on_region") = py::none(), py::arg("any_sizes") = false, py::arg("dynamic") = -1,
      py::arg("entry_code") = py::none());

  m.def(
      "make_disabled",
      [compiled_type](py::object fn) {
        PyObject* out = new_compiled_function(compiled_type.ptr(), fn.ptr(), nullptr);
        if (out == nullptr) throw py::error_already_set();
        return py::reinterpret_steal<py::object>(out);
      },
      py::arg("fn"));

  m.def(
      "reset",
      []() { reset_all_code_states(); },
      "Drops every region of every code object. The cache of meta results stays: it is a pure "
      "function of torch's ops and metadata (as FakeTensor's dispatch cache outlives "
      "torch._dynamo.reset()), and a cold op costs 100-200 us on meta tensors.");
  m.def("clear_meta_cache", &clear_meta_cache,
        "Drops the cache of meta results (op, argument metadata) -> result metadata.");
  m.def(
      "meta_stats",
      []() {
        const MetaCacheStats& s = meta_cache_stats();
        return py::dict(py::arg("hits") = s.hits, py::arg("misses") = s.misses,
                        py::arg("uncacheable") = s.uncacheable);
      },
      "How traced torch calls got their meta results: hits, misses, uncacheable (counts).");
  m.def("set_trace_rules", &set_trace_rules, py::arg("rules"),
        "The trace policy: [(file-name prefix, rule)], rule 0 not traced, 1 traced, 2 traced "
        "only inlined into traced code; the longest matching prefix decides.");
  m.def("allow_code", &allow_code, py::arg("code"));
  m.def("forget_callable", [](py::handle fn) { PyRefs::get().forget(fn); }, py::arg("fn"),
        "Drops fn's cached classification (framejit.allow_in_graph changed it).");
  m.def("set_log_mask", &set_log_mask, py::arg("mask"));
  m.def("code_stats", &code_stats, py::arg("fn"),
        "Regions of a function's code object: kind, graph, guards, hits.");
  m.def("graphs_compiled", &graphs_compiled);
  m.def("hook_installed", []() { return fj_hook_installed() != 0; });
  m.def("_testing_eval_frame_probe", [](int action) { return fj_testing_probe(action); },
        "Test probe: 1 installs a frame-counting eval-frame function, 2 removes it, 3 says "
        "whether it is installed, 0 reads its count.");
  m.def(
      "decode_bytecode",
      [](py::handle fn) { return Bytecode::from_code(code_of(fn))->to_string(); },
      py::arg("fn"));
}
