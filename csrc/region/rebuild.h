// How a region rebuilds Python values (its return value, the locals and value stack at its
// exit, scalar graph inputs) from graph outputs, sources and constants.
#pragma once

#include <string>
#include <vector>

#include "common/py.h"
#include "common/ref.h"
#include "guards/source.h"

namespace framejit {

struct Rebuild {
  enum class Kind : uint8_t {
    kOutput,  // graph output `index`
    kSlot,    // the value of source slot `index` (an entry value passed on as it is)
    kConst,   // `value`
    kTuple,   // `items`, made into `value` (tuple, namedtuple, structseq type)
    kList,
    kDict,    // `keys` -> `items`
    kCall,    // value(*items): Python arithmetic on numbers, iter(...) of a materialised iterator
    kNull,    // a NULL stack entry (CPython's marker before a callable)
  };
  Kind kind = Kind::kConst;
  int index = -1;
  // >= 0: the built object is kept in the call's memo at this index and reused, so a list held
  // by two locals is still one list after the exit.
  int memo = -1;
  py::object value;
  std::vector<Rebuild> items;
  std::vector<py::object> keys;

  static Rebuild slot(int index);
  static Rebuild constant(py::object value);
  static Rebuild call(py::object fn, std::vector<Rebuild> args);

  // Borrowed: outputs (a tuple or list; may be NULL when the region has no graph), slots.
  // `memo` has one entry per memo index (NULL until built). Returns a new reference, or NULL
  // with an exception set (kNull returns NULL with no exception).
  PyObject* build(PyObject* outputs, const SlotValues& slots, class MemoTable& memo) const;

  std::string to_string() const;  // "(out[0], slot[1], 3)"
  // Whether building it reads a graph output (else it can be built before the graph runs).
  bool reads_outputs() const;
};

// The memoised objects of one exit (built once however often they are referenced).
class MemoTable {
 public:
  explicit MemoTable(size_t n) : objects_(n) {}
  MemoTable(const MemoTable&) = delete;
  MemoTable& operator=(const MemoTable&) = delete;
  // Borrowed, NULL until built.
  PyObject* get(int index) const {
    return index >= 0 && static_cast<size_t>(index) < objects_.size() ? objects_[index].get()
                                                                      : nullptr;
  }
  void set(int index, Ref object) { objects_.at(static_cast<size_t>(index)) = std::move(object); }

 private:
  std::vector<Ref> objects_;
};

}  // namespace framejit
