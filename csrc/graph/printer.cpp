// The graph printer: runnable-looking Python with the user's file and line per node.
#include "graph/printer.h"

#include <fmt/format.h>

#include <memory>
#include <unordered_map>

#include "common/check.h"

namespace framejit {

std::string print_arg(const Arg& arg) {
  switch (arg.kind) {
    case Arg::Kind::kNode:
      return arg.node->name;
    case Arg::Kind::kConst:
      return safe_repr(arg.value);
    case Arg::Kind::kTuple:
    case Arg::Kind::kList: {
      const bool tuple = arg.kind == Arg::Kind::kTuple;
      std::string out = tuple ? "(" : "[";
      for (size_t i = 0; i < arg.items.size(); ++i) {
        if (i) out += ", ";
        out += print_arg(arg.items[i]);
      }
      if (tuple && arg.items.size() == 1) out += ",";
      return out + (tuple ? ")" : "]");
    }
    case Arg::Kind::kDict: {
      std::string out = "{";
      for (size_t i = 0; i < arg.items.size(); ++i) {
        if (i) out += ", ";
        out += fmt::format("'{}': {}", arg.keys[i], print_arg(arg.items[i]));
      }
      return out + "}";
    }
  }
  return "?";
}

namespace {

std::string print_call_args(const Node& node, size_t skip) {
  std::string out;
  for (size_t i = skip; i < node.args.size(); ++i) {
    if (!out.empty()) out += ", ";
    out += print_arg(node.args[i]);
  }
  for (const auto& [key, value] : node.kwargs) {
    if (!out.empty()) out += ", ";
    out += key + " = " + print_arg(value);
  }
  return out;
}

std::string print_expr(const Node& node) {
  if (node.kind == NodeKind::kCallMethod) {
    FJ_CHECK(!node.args.empty(), "call_method {} without self", node.name);
    return fmt::format("{}.{}({})", print_arg(node.args[0]), node.target_text,
                       print_call_args(node, 1));
  }
  const std::string& op = node.infix;
  if (!op.empty() && node.kwargs.empty()) {
    if (op == "[]" && node.args.size() == 2) {
      return fmt::format("{}[{}]", print_arg(node.args[0]), print_arg(node.args[1]));
    }
    if (node.args.size() == 2) {
      return fmt::format("{} {} {}", print_arg(node.args[0]), op, print_arg(node.args[1]));
    }
    if (node.args.size() == 1) return op + print_arg(node.args[0]);
  }
  return fmt::format("{}({})", node.target_text, print_call_args(node, 0));
}

}  // namespace

std::string print_graph(const Graph& graph, const LineSource& line_source) {
  std::string signature = "def forward(self";
  for (const Node* ph : graph.placeholders()) {
    signature += fmt::format(", {}: \"{}\"", ph->name, ph->meta_text());
  }
  std::string out = signature + "):\n";
  int last_line = -1;
  std::string last_file;
  std::unordered_map<std::string, LineSource> inlined_files;
  for (const auto& node : graph.nodes()) {
    if (node->kind == NodeKind::kPlaceholder) continue;
    if (node->kind == NodeKind::kOutput) {
      out += fmt::format("    return {}\n", print_arg(node->args[0]));
      continue;
    }
    const std::string& file = node->filename.empty() ? graph.filename() : node->filename;
    if (node->line >= 0 && (node->line != last_line || file != last_file)) {
      std::string code;
      if (!node->filename.empty()) {
        auto found = inlined_files.find(node->filename);
        if (found == inlined_files.end()) {
          found = inlined_files.emplace(node->filename, linecache_source(node->filename)).first;
        }
        code = found->second(node->line);
      } else if (line_source) {
        code = line_source(node->line);
      }
      out += fmt::format("    # File: {}:{} in {}, code: {}\n", file, node->line,
                         node->function.empty() ? graph.function_name() : node->function, code);
      last_line = node->line;
      last_file = file;
    }
    const std::string meta = node->meta_text();
    if (meta.empty()) {
      out += fmt::format("    {} = {}\n", node->name, print_expr(*node));
    } else {
      out += fmt::format("    {}: \"{}\" = {}\n", node->name, meta, print_expr(*node));
    }
  }
  for (const auto& [name, text] : graph.outlined_texts()) out += fmt::format("\n# {}:\n{}", name, text);
  return out;
}

LineSource linecache_source(const std::string& filename) {
  // linecache's list of the file's lines is fetched once, on the first lookup (one linecache
  // call per printed line was a fifth of the compile time of a 1,000-line function).
  auto lines = std::make_shared<py::object>();
  return [filename, lines](int line) -> std::string {
    try {
      if (!*lines) *lines = py::module_::import("linecache").attr("getlines")(filename);
      py::list all = py::reinterpret_borrow<py::list>(*lines);
      if (line < 1 || static_cast<size_t>(line) > all.size()) return {};
      std::string s = all[line - 1].cast<std::string>();
      const auto begin = s.find_first_not_of(" \t");
      const auto end = s.find_last_not_of(" \t\r\n");
      return begin == std::string::npos ? std::string() : s.substr(begin, end - begin + 1);
    } catch (const py::error_already_set&) {
      return {};
    }
  };
}

}  // namespace framejit
