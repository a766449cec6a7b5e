// The graph recorder: owns the region's graph, gives each torch call its result metadata by
// running it on meta tensors (memoised across traces), infers the real device beside it, and
// records the nodes, placed at the instruction being traced.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/py.h"
#include "graph/graph.h"
#include "guards/tensor_check.h"
#include "trace/trace_site.h"
#include "trace/value.h"

namespace framejit {

// A node to record: the call and the metadata of its result.
struct NodeSpec {
  NodeKind kind = NodeKind::kCallFunction;
  py::object target;         // the callable, or the method's name (kCallMethod)
  std::string target_text;   // "torch.add", "operator.getitem", "size"
  std::string infix;         // "+", "[]": operator targets
  std::vector<Arg> args;
  Kwargs kwargs;
  py::object fake;           // the meta result (None for a mode switch)
  std::vector<TensorMeta> metas;
  bool tuple_result = false;  // the call returns a tuple of tensors (getitem nodes follow)
  std::string name_hint;
};

// A torch call to run on meta values for its result's metadata.
struct MetaCall {
  py::handle fn;             // kCallFunction: the function
  std::string method;        // kCallMethod: the method's name, "" otherwise
  std::string target_text;   // for messages
  py::list args;             // meta values: meta tensors, constants, containers of them
  py::dict kwargs;
  bool any_tensor = false;   // some argument holds a tensor
  bool mutates = false;      // in place (or .cuda() / .cpu()): run every time, never memoised
  // Under autocast: id(meta tensor) -> its real device, for the fake-tensor run.
  std::function<py::dict()> real_devices;
};

// How torch calls met their meta results since the process started (framejit._C.meta_stats()).
struct MetaCacheStats {
  uint64_t hits = 0;         // replayed from the cache
  uint64_t misses = 0;       // run on meta tensors, then cached
  uint64_t uncacheable = 0;  // run on meta tensors every time (in-place, unkeyable arguments)
};
MetaCacheStats& meta_cache_stats();

// The memo of meta results, process-wide (TraceState). Running a torch op on meta tensors costs
// 100-500 us (many meta kernels are Python decompositions); the same op on the same metadata
// recurs constantly (layers, unrolled loops). Results are kept by (op, argument metadata and
// constants, grad mode, default dtype) and rebuilt as fresh meta tensors. In-place ops, results
// that alias an input object and results with a storage offset are never kept.
struct CachedMeta {
  py::object fn;  // held, so the address in the key can never name another object
  bool sequence = false;
  py::object sequence_type;  // tuple, list, or a structseq type
  std::vector<MetaShape> outputs;
};

struct MetaMemo {
  std::unordered_map<std::string, CachedMeta> results;
  MetaCacheStats stats;
};
// Drops the cache of meta results (framejit._C.clear_meta_cache()).
void clear_meta_cache();

// "cpu", "cuda:0", ...: str() of a torch.device (read directly) or of anything else.
std::string device_string(py::handle device);
bool is_device_type(const std::string& device, const char* type);

class GraphRecorder {
 public:
  // Borrowed: code (the region's own), site (outlives the recorder).
  GraphRecorder(PyCodeObject* code, const TraceSite& site);
  GraphRecorder(const GraphRecorder&) = delete;
  GraphRecorder& operator=(const GraphRecorder&) = delete;

  Graph& graph() { return graph_; }
  const TraceSite& site() const { return site_; }

  Node* placeholder(const std::string& hint, py::object fake, const TensorMeta& meta);
  // A call node at the site's line (and, in an inlined callee, its file and function).
  Node* add(NodeSpec spec);
  // The output node; getitem nodes nobody uses are dropped; each checkpointed body becomes a
  // graph of its own that one node calls.
  void finish(std::vector<Arg> outputs);

  // A checkpointed function's body (torch.utils.checkpoint.checkpoint(fn, ...)): the calls
  // recorded until close_checkpoint() are outlined at finish() into their own GraphModule,
  // which one node runs through checkpoint with `checkpoint_kwargs` (use_reentrant=False, ...)
  // where gradients are needed (_support.CheckpointedBody).
  void open_checkpoint(py::dict checkpoint_kwargs);
  void close_checkpoint() { graph_.close_scope(); }
  bool in_checkpoint() const { return graph_.current_scope() >= 0; }

  // The metadata the printer and guards keep of a meta tensor (or shaped value) on `device`.
  static TensorMeta meta_of(py::handle meta, py::handle device);

  // The call's result on meta tensors, memoised by op and argument metadata; under autocast on
  // fake tensors of the real devices (autocast's dtypes). `explicit_device` is set to the
  // default device when a factory (no tensor argument, no device=) ran on meta. Throws
  // Unsupported when the op fails on meta tensors.
  py::object run_meta(const MetaCall& call, py::object& explicit_device);

  // The real device of a call's result: `explicit_device` if set, else that of the tensor
  // arguments (non-CPU wins, as CPU scalars combine with CUDA tensors), else the default.
  static py::object infer_device(py::object explicit_device, const std::vector<ValuePtr>& args,
                                 const KwValues& kwargs);

 private:
  const TraceSite& site_;
  Graph graph_;
  std::vector<py::dict> checkpoint_kwargs_;  // per scope of graph_
  std::vector<Node> checkpoint_sites_;       // per scope: where checkpoint was called (located)
};

}  // namespace framejit
