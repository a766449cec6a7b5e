// How a region rebuilds Python values (its return value) from graph outputs, sources, constants.
#pragma once

#include <string>
#include <vector>

#include "common/py.h"
#include "guards/source.h"

namespace framejit {

struct Rebuild {
  enum class Kind : uint8_t {
    kOutput,  // graph output `index`
    kSlot,    // the value of source slot `index` (an input returned as it is)
    kConst,   // `value`
    kTuple,   // `items`, made into `value` (tuple, namedtuple, structseq type)
    kList,
    kDict,    // `keys` -> `items`
  };
  Kind kind = Kind::kConst;
  int index = -1;
  py::object value;
  std::vector<Rebuild> items;
  std::vector<py::object> keys;

  // Borrowed: outputs (a tuple or list; may be NULL when the region has no graph), slots.
  // Returns a new reference, or NULL with an exception set.
  PyObject* build(PyObject* outputs, const SlotValues& slots) const;

  std::string to_string() const;  // "(out[0], L['x'], 3)"
};

}  // namespace framejit
