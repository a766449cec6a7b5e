// Sources: how to find a value of the entry state again on every call (L['x'], L['d']['k'], ...).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/py.h"
#include "common/ref.h"

namespace framejit {

enum class SourceKind : uint8_t {
  kLocal,   // frame local (fast local) `index`
  kGlobal,  // name `key` in the frame's globals, else its builtins
  kAttr,    // getattr(slot `base`, `key`)
  kItem,    // slot `base`[`key`]
  kStack,   // entry value stack position `index` (regions that start mid-frame)
  kGlobalOf,  // name `key` in the dict `owner` (an inlined function's globals), else builtins
  kClosure,   // cell `index` of the frame's function's closure
  kGlobalsDict,  // the frame's globals dict itself (identity-guarded where a region writes it)
  kContextValue,  // the value of the contextvars.ContextVar in slot `base` in the running context
                  // (where unset: `key` if set, else the variable's default, else unreadable)
  kWeakTarget,    // what the weakref.ref in slot `base` refers to: r(), None once it is dead
  kLocalBound,    // whether frame local `index` is bound: True or False (never unreadable)
};

struct Source {
  SourceKind kind = SourceKind::kLocal;
  int base = -1;
  int index = 0;
  py::object key;
  py::object owner;       // kGlobalOf: the globals dict (held, so its address stays valid)
  bool generic = false;   // kAttr: read as object.__getattribute__ does (past a class's own
                          // __getattribute__, which a guard must not run)
  std::string text;       // L['inputs']['x'], G['torch'], L['self'].weight
  std::string name_hint;  // inputs_x: used for placeholder names

  // kItem on an exact dict, kGlobal found in the globals: the last lookup, reused while that
  // dict's version tag is unchanged (the dict then still holds the value).
  mutable PyObject* cached_dict = nullptr;   // address only, never dereferenced when stale
  mutable uint64_t cached_version = 0;
  mutable PyObject* cached_value = nullptr;  // Borrowed from cached_dict
};

// The borrowed pieces of a live frame that sources read from.
struct FrameState {
  PyObject** localsplus = nullptr;
  PyObject* globals = nullptr;
  PyObject* builtins = nullptr;
  PyObject* const* stack = nullptr;  // the runtime's value stack at a region entry
  int stack_size = 0;
  PyObject* function = nullptr;  // the frame's function (for its closure)
};

// Values of sources for one call: slot i owns a reference to source i's value (or is NULL).
class SlotValues {
 public:
  void reset(size_t n) { values_.reset(n); }
  void clear() { values_.clear(); }
  PyObject* operator[](size_t i) const { return values_[i].get(); }  // Borrowed
  // Stolen: value.
  void set(size_t i, PyObject* value) { values_[i].reset(value); }
  size_t size() const { return values_.size(); }
  // The values as an array of borrowed pointers.
  PyObject* const* data() const { return values_.borrowed(); }

 private:
  RefBuffer<32> values_;
};

class SourceTable {
 public:
  // Returns the slot of an equal source (the same text read from the same base and owner),
  // adding it if new.
  int intern(Source source);
  // Drops the most recently interned source (one that turned out unreadable at trace time, so
  // that no guard ever tries to read it).
  void pop_last() { sources_.pop_back(); }
  // The slot of an equal source, or -1.
  int find(const Source& source) const;
  const Source& at(int slot) const { return sources_[slot]; }
  int size() const { return static_cast<int>(sources_.size()); }

  // Reads source `slot` from the frame and the slots before it. Returns a new reference, or NULL
  // with no exception set if the value is missing (unbound local, missing key or attribute).
  // Hot path: raw CPython API, no pybind11.
  PyObject* read(int slot, const FrameState& frame, PyObject* const* slots) const;

  static Source local(int index, const std::string& name);
  // Whether the local is bound (a region entered mid-frame where a 3.12 comprehension saves it).
  static Source local_bound(int index, const std::string& name);
  static Source global(const std::string& name);
  static Source stack(int index);
  static Source global_of(py::object globals, const std::string& name);
  // sys.modules[name]: what `import name` gives once the module is imported.
  static Source imported_module(const std::string& name);
  static Source closure(int index);
  static Source globals_dict();
  Source attr(int base, const std::string& name) const;
  // object.__getattribute__(base, name): an attribute of an object whose class defines its own
  // __getattribute__, looked up as that method's super() call does.
  Source generic_attr(int base, const std::string& name) const;
  Source item(int base, py::object key) const;
  // The value the ContextVar read from `base` has now: var.get(), or, with `unset`, the value
  // set in the running context, `unset` where it has none.
  Source context_value(int base, py::object unset = py::object()) const;
  Source weak_target(int base) const;
  // slot `base`[the object read from slot `key_slot`]: a dict keyed by objects that hash by
  // identity (an optimizer's state, keyed by parameters), named after the key's source.
  Source item_by_object(int base, py::object key, int key_slot) const;

 private:
  std::vector<Source> sources_;
};

}  // namespace framejit
