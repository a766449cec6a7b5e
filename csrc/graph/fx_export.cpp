// Builds a torch.fx.Graph node by node from the IR.
#include "graph/fx_export.h"

#include <unordered_map>

#include "common/check.h"

namespace framejit {

namespace {

py::object to_fx_arg(const Arg& arg, const std::unordered_map<const Node*, py::object>& fx) {
  switch (arg.kind) {
    case Arg::Kind::kNode: {
      auto it = fx.find(arg.node);
      FJ_CHECK(it != fx.end(), "argument {} not exported yet", arg.node->name);
      return it->second;
    }
    case Arg::Kind::kConst:
      return arg.value;
    case Arg::Kind::kTuple:
    case Arg::Kind::kList: {
      py::list items;
      for (const Arg& item : arg.items) items.append(to_fx_arg(item, fx));
      if (arg.kind == Arg::Kind::kList) return std::move(items);
      return py::tuple(items);
    }
    case Arg::Kind::kDict: {
      py::dict out;
      for (size_t i = 0; i < arg.items.size(); ++i) {
        out[py::str(arg.keys[i])] = to_fx_arg(arg.items[i], fx);
      }
      return std::move(out);
    }
  }
  throw InternalError("unknown argument kind");
}

}  // namespace

py::object export_fx_graph(const Graph& graph) {
  GcPause no_gc;
  py::module_ fx_mod = py::module_::import("torch.fx");
  py::object fx_graph = fx_mod.attr("Graph")();
  std::unordered_map<const Node*, py::object> fx;
  for (const auto& node : graph.nodes()) {
    py::object created;
    switch (node->kind) {
      case NodeKind::kPlaceholder:
        created = fx_graph.attr("placeholder")(node->name);
        break;
      case NodeKind::kCallFunction:
      case NodeKind::kCallMethod: {
        py::list args;
        for (const Arg& arg : node->args) args.append(to_fx_arg(arg, fx));
        py::dict kwargs;
        for (const auto& [key, value] : node->kwargs) kwargs[py::str(key)] = to_fx_arg(value, fx);
        const char* op = node->kind == NodeKind::kCallFunction ? "call_function" : "call_method";
        created = fx_graph.attr("create_node")(op, node->target, py::tuple(args), kwargs,
                                               node->name);
        break;
      }
      case NodeKind::kOutput:
        created = fx_graph.attr("output")(to_fx_arg(node->args[0], fx));
        break;
    }
    if (node->fake && !node->fake.is_none()) {
      created.attr("meta")["example_value"] = node->fake;
    }
    fx[node.get()] = created;
  }
  return fx_graph;
}

}  // namespace framejit
