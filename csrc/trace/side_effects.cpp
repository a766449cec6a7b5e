// Attribute and global writes of a region, read back by later loads of the same trace.
#include "trace/side_effects.h"

#include "common/check.h"

namespace framejit {

const ValuePtr* SideEffects::pending(const ValuePtr& base, const std::string& name) const {
  for (auto it = writes_.rbegin(); it != writes_.rend(); ++it) {  // latest write wins
    if (it->name != name || it->key) continue;
    // Global writes target their module by object: `import m; m.x` after `global x; x = t`.
    if (it->target == base ||
        (PyModule_Check(base->obj.ptr()) && it->target->obj.ptr() == base->obj.ptr())) {
      return &it->value;
    }
    if (!base->is_special_object() && !it->target->is_special_object() &&
        it->target->obj.ptr() == base->obj.ptr()) {
      // The same object reached another way (a second argument, a value kept on the stack
      // across a break): the write is not visible through this value. Left to the runtime,
      // after the exit has replayed the write.
      FJ_UNSUPPORTED(kSideEffect, "attribute '{}' of {}, written through another reference",
                     name, base->describe());
    }
  }
  return nullptr;
}

const ValuePtr* SideEffects::pending_item(const ValuePtr& dict, PyObject* key) const {
  for (auto it = writes_.rbegin(); it != writes_.rend(); ++it) {  // latest write wins
    if (it->key && it->target->obj.ptr() == dict->obj.ptr() && it->key_object.ptr() == key) {
      return &it->value;
    }
  }
  return nullptr;
}

bool SideEffects::items_written(PyObject* dict) const {
  for (const PendingWrite& write : writes_) {
    if (write.key && write.target->obj.ptr() == dict) return true;
  }
  return false;
}

const ValuePtr* SideEffects::stored_global(PyObject* globals, const std::string& name) const {
  for (auto it = writes_.rbegin(); it != writes_.rend(); ++it) {  // latest write wins
    if (it->name == name && PyModule_Check(it->target->obj.ptr()) &&
        PyModule_GetDict(it->target->obj.ptr()) == globals) {
      return &it->value;
    }
  }
  return nullptr;
}

py::object SideEffects::module_owning(py::handle globals) {
  PyObject* module_name = PyDict_GetItemString(globals.ptr(), "__name__");  // Borrowed
  PyObject* module = nullptr;
  if (module_name != nullptr && PyUnicode_Check(module_name)) {
    module = PyImport_GetModule(module_name);  // New or NULL
    if (module == nullptr) PyErr_Clear();
  }
  py::object owner = py::reinterpret_steal<py::object>(module);
  // An exact module: its setattr is the dict store STORE_GLOBAL does (a subclass may not be).
  if (!owner || !PyModule_CheckExact(owner.ptr()) ||
      PyModule_GetDict(owner.ptr()) != globals.ptr()) {
    return py::none();
  }
  return owner;
}

}  // namespace framejit
