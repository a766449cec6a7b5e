// Side effects of a region on objects that existed before it: attribute writes (and global
// writes, as writes to the module owning the globals), kept in program order, read back by later
// loads in the same trace, and replayed at the region's exit; and the lists and dicts read by
// source that the trace changes in place, whose final contents the exit writes back.
#pragma once

#include <string>
#include <vector>

#include "common/py.h"
#include "trace/value.h"

namespace framejit {

struct PendingWrite {
  ValuePtr target;  // the object written (a module for a global write)
  std::string name;
  ValuePtr value;
  bool generic = false;  // object.__setattr__ (from an inlined __setattr__): past the class's
};

class SideEffects {
 public:
  void record(ValuePtr target, std::string name, ValuePtr value, bool generic = false) {
    writes_.push_back({std::move(target), std::move(name), std::move(value), generic});
  }
  // The value this region last stored as base.name, or nullptr. Throws Unsupported when the same
  // object was written through another value (a second reference: the write would not be seen).
  const ValuePtr* pending(const ValuePtr& base, const std::string& name) const;
  // The value this region last stored as global `name` of the globals dict `globals`.
  const ValuePtr* stored_global(PyObject* globals, const std::string& name) const;
  // In program order.
  const std::vector<PendingWrite>& writes() const { return writes_; }
  // A list or dict read by source, now changed by the trace (Value::adopted).
  void adopt(ValuePtr container) { adopted_.push_back(std::move(container)); }
  const std::vector<ValuePtr>& adopted() const { return adopted_; }

  // The module whose __dict__ is `globals` (found through sys.modules[__name__]), if it is an
  // exact module: setattr on it is the dict store STORE_GLOBAL does. None otherwise (code run
  // with the globals of no module).
  static py::object module_owning(py::handle globals);

 private:
  std::vector<PendingWrite> writes_;
  std::vector<ValuePtr> adopted_;
};

}  // namespace framejit
