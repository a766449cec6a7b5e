// A region's guards: a flat program over its sources, checked before every run of the region.
#pragma once

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "guards/source.h"
#include "guards/tensor_check.h"

namespace framejit {

enum class GuardKind : uint8_t {
  kType,          // type(value) is expected
  kId,            // value is expected
  kConstEq,       // type(value) is type(expected) and value == expected
  kTensor,        // one fused metadata check (TensorSpec)
  kLen,           // len(value) == n, value a tuple, list or dict (the type is guarded apart)
  kDictContains,  // (key in value) == flag, value a dict
  kDictKeys,      // list(value) == expected (a tuple of keys, in order), value an exact dict or
                  // OrderedDict, or an exact set or frozenset (its iteration order)
  kDistinct,      // value is not the value of slot n (two sources the trace took as two objects)
  kSame,          // value is the value of slot n (two sources the trace found to be one object)
  kSizeRelation,  // value.size(dim) REL (slot n's value).size(other_dim), both tensors (a
                  // comparison of two input sizes the trace decided: `kv_length > q_length`)
  kIntRelation,   // value REL n, value an int (its exact type guarded apart): a comparison the
                  // trace decided on an int input (`if step < warmup`)
  kLinearRelation,  // sum of factor * (a slot's int, or a size of a slot's tensor) + n REL 0,
                    // checked at the last of those slots: a comparison the trace decided on int
                    // inputs and sizes together (`cumulative_length + q_length >= window`); with
                    // a modulus m, (sum + n) % m REL `remainder` (`height % 8 != 0`)
  kTypeVersion,   // value is the class in expected = (class, name, present, found) and looking
                  // name up on it finds something iff present (and, unless found is None, finds
                  // found itself). Fast path: the class's attribute
                  // version tag is still n (nothing of it or a base was set or deleted since);
                  // otherwise the lookup runs and n takes the new tag (torch.fx and others patch
                  // and restore nn.Module attributes, which changes the tags of all modules)
};

struct Guard {
  GuardKind kind;
  int slot;
  py::object expected;  // kType: the type; kId/kConstEq: the object; kDictContains: the key
  mutable int64_t n = 0;  // kLen: length; kDictContains: 1 if the key must be present;
                         // kTypeVersion: the tag last seen; kIntRelation: the bound
  int spec = -1;        // kTensor: index into GuardSet::tensor_specs_
  int dim = -1;         // kSizeRelation: the dims compared and how (SizeRelation)
  int other_dim = -1;
  uint8_t rel = 0;      // kSizeRelation, kIntRelation, kLinearRelation: the SizeRelation
  struct Term {
    int slot;
    int dim;  // -1: the slot's value, an int
    int64_t factor;
    bool operator==(const Term& other) const {
      return slot == other.slot && dim == other.dim && factor == other.factor;
    }
  };
  std::vector<Term> terms;  // kLinearRelation (n: the constant)
  int64_t modulus = 0;      // kLinearRelation: 0, or the sum is taken modulo this (> 0)
  int64_t remainder = 0;    // and compared with this
};

// How two sizes compare in a kSizeRelation guard.
enum class SizeRelation : uint8_t { kLt, kLe, kGt, kGe, kEq, kNe };

// `a REL b` as `b flipped(REL) a`.
inline SizeRelation flipped(SizeRelation rel) {
  static constexpr SizeRelation kFlipped[] = {SizeRelation::kGt, SizeRelation::kGe,
                                              SizeRelation::kLt, SizeRelation::kLe,
                                              SizeRelation::kEq, SizeRelation::kNe};
  return kFlipped[static_cast<int>(rel)];
}
// The relation that holds where `a REL b` is false.
inline SizeRelation negated(SizeRelation rel) {
  static constexpr SizeRelation kNegated[] = {SizeRelation::kGe, SizeRelation::kGt,
                                              SizeRelation::kLe, SizeRelation::kLt,
                                              SizeRelation::kNe, SizeRelation::kEq};
  return kNegated[static_cast<int>(rel)];
}
inline const char* relation_text(SizeRelation rel) {
  static const char* const kText[] = {"<", "<=", ">", ">=", "==", "!="};
  return kText[static_cast<int>(rel)];
}
// `L['n'] + L['x'].size(1) >= 4096` for terms + constant REL 0.
std::string linear_relation_text(const std::vector<Guard::Term>& terms, int64_t constant,
                                 SizeRelation rel, const SourceTable& sources, int64_t modulus = 0,
                                 int64_t remainder = 0);
inline bool relation_holds(SizeRelation rel, int64_t a, int64_t b) {
  switch (rel) {
    case SizeRelation::kLt: return a < b;
    case SizeRelation::kLe: return a <= b;
    case SizeRelation::kGt: return a > b;
    case SizeRelation::kGe: return a >= b;
    case SizeRelation::kEq: return a == b;
    case SizeRelation::kNe: return a != b;
  }
  return false;
}

class EntryState;

class GuardSet {
 public:
  GuardSet() = default;

  // Reads every source into `slots` and checks each guard right after its source is read, so a
  // type guard on a container runs before anything is read out of it. Hot path: raw CPython
  // API and TensorSpec only, no pybind11, no allocation past SlotValues' inline capacity.
  bool check(const SourceTable& sources, const FrameState& frame, SlotValues& slots) const;

  // The first failing guard as readable text, or "" if all pass (for the recompiles log).
  std::string first_failure(const SourceTable& sources, const FrameState& frame) const;

  // One guard per line ("TENSOR_MATCH L['x'] Tensor float cpu sizes=[2]...").
  std::string to_string(const SourceTable& sources) const;

  size_t size() const { return guards_.size() + 1 + (shape_.check ? 1 : 0); }  // + global state

  // The guards a backend's ShapeEnv recorded while it compiled the region's graph with symbolic
  // sizes (ranges, equalities between sizes, specialisations): `check(*values)` is true while
  // they all hold, `explain(*values)` names the first that fails ("" if none), for the values
  // of `slots` in order; `texts` are the guards, one per line, for the guards log. Written by
  // the runtime after the backend returns (the trace's entry state has handed its guards over
  // by then), checked after every other guard.
  void add_shape_guards(py::object check, py::object explain, std::vector<int> slots,
                        std::vector<std::string> texts);
  bool has_shape_guards() const { return static_cast<bool>(shape_.check); }
  std::string shape_guards_text() const;  // "SHAPE_GUARD ..." lines
  const GlobalTorchState& entry_state() const { return global_; }

 private:
  // Guards are written by the trace's entry state only (trace/entry_state.h): what a region
  // assumed is decided in one place.
  friend class EntryState;

  void add_type(int slot, PyObject* type);
  void add_id(int slot, PyObject* obj);
  void add_const(int slot, PyObject* value);
  void add_tensor(int slot, PyObject* tensor);
  void add_len(int slot, int64_t n);
  void add_dict_contains(int slot, PyObject* key, bool present);
  // Borrowed: keys, a tuple.
  void add_dict_keys(int slot, PyObject* keys);
  // Borrowed: type, name, found. Whether looking `name` up on `type` (its MRO) finds something
  // stays `present`, and, with `found`, that it finds that very object; the type's version tag
  // must be assigned (nonzero).
  void add_type_version(int slot, PyTypeObject* type, PyObject* name, bool present,
                        PyObject* found = nullptr);
  // The values of the two slots are not the same object.
  void add_distinct(int slot, int other);
  void add_same(int slot, int other);
  // value(slot).size(dim) REL value(other).size(other_dim), kept on the later slot.
  void add_size_relation(int slot, int dim, SizeRelation rel, int other, int other_dim);
  // value(slot) REL bound, value(slot) an int.
  void add_int_relation(int slot, SizeRelation rel, int64_t bound);
  // sum(terms) + constant REL 0 (kLinearRelation).
  void add_linear_relation(std::vector<Guard::Term> terms, int64_t constant, SizeRelation rel,
                           int64_t modulus = 0, int64_t remainder = 0);
  // kDistinct / kSame between two slots, kept on the later one (checked once both are read).
  void add_pair(GuardKind kind, int slot, int other);
  // Tensor guards check rank, dtype, device, requires_grad and type but no strides, and no
  // sizes except those in `fixed` (dims by source slot): for a trace that read only those
  // into Python, handed to a backend that runs any size.
  void allow_any_sizes(const std::map<int, std::set<int>>& fixed = {});
  // For a graph a backend compiles with symbolic sizes: the tensor guards of the slots in
  // `symbolic` check every size but those dims, and the layout (dense, in the traced stride
  // order) in place of exact strides. Other tensor guards stay exact.
  void allow_symbolic_dims(const std::map<int, std::set<int>>& symbolic);
  // Tensor guards that check sizes by dimension (after the two above) also keep these dims of
  // these slots within [lo, hi].
  void bound_dims(const std::map<int, std::vector<TensorSpec::DimRange>>& ranges);

  // Borrowed: slots, the values read so far (kDistinct compares with an earlier one).
  bool check_one(const Guard& guard, PyObject* value, PyObject* const* slots) const;
  std::string describe(const Guard& guard, const SourceTable& sources) const;

  struct ShapeGuards {
    py::object check;    // None: no shape guards
    py::object explain;
    std::vector<int> slots;
    std::vector<std::string> texts;
  };
  // Borrowed: slots, all of them read.
  bool check_shapes(PyObject* const* slots) const;

  // Adds a guard unless an identical one is there already.
  void push(Guard guard);

  std::vector<Guard> guards_;  // in source order once sorted
  ShapeGuards shape_;
  std::vector<TensorSpec> tensor_specs_;
  GlobalTorchState global_ = current_global_torch_state();
  mutable bool sorted_ = false;
  void sort() const;
  mutable std::vector<Guard> by_slot_;
};

}  // namespace framejit
