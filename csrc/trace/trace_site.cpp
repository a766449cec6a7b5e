// TraceSite: file:line of the instruction being traced, and node locations in inlined callees.
#include "trace/trace_site.h"

#include <fmt/format.h>

#include <cstring>

#include "graph/graph.h"

namespace framejit {

std::string TraceSite::here() const {
  const char* file = code ? PyUnicode_AsUTF8(code->co_filename) : nullptr;
  if (file == nullptr) {
    PyErr_Clear();
    file = "?";
  }
  const char* slash = std::strrchr(file, '/');
  return fmt::format("{}:{}", slash ? slash + 1 : file, line());
}

void TraceSite::locate(Node* node) const {
  if (!inlined) return;
  const char* file = PyUnicode_AsUTF8(code->co_filename);
  const char* name = PyUnicode_AsUTF8(code->co_qualname);
  if (!file || !name) {
    PyErr_Clear();
    return;
  }
  node->filename = file;
  node->function = name;
}

}  // namespace framejit
