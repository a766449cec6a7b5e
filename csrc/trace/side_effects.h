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
  ValuePtr key;          // set for an item write target[key] = value (name empty): a dict read
                         // by source, keyed by an object of the entry state
  py::object key_object;  // that key's real object
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
  // dict[key] = value on a dict read by source, with `key` an object of the entry state (a
  // defaultdict's default made for a missing key): replayed at the exit.
  void record_item(ValuePtr dict, ValuePtr key, py::object key_object, ValuePtr value) {
    writes_.push_back({std::move(dict), std::string(), std::move(value), false, std::move(key),
                       std::move(key_object)});
  }
  // The value this region last stored as dict[key] (the same key object), or nullptr.
  const ValuePtr* pending_item(const ValuePtr& dict, PyObject* key) const;
  // Whether the region stored an item into `dict` (its real object).
  bool items_written(PyObject* dict) const;
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
