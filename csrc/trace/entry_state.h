// The entry state of a region: the sources the trace read (how to find each value again on every
// call), their live values at trace time, the graph inputs, and the guards, of which this is the
// only writer. Everything a region assumes about the state it starts from is added here.
#pragma once

#include <map>
#include <set>
#include <string>
#include <utility>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/py.h"
#include "common/ref.h"
#include "guards/guards.h"
#include "guards/source.h"
#include "region/rebuild.h"
#include "trace/recorder.h"
#include "trace/value.h"

namespace framejit {

// Values of these exact types are constants: guarded by value, folded at trace time.
bool is_constant_type(PyObject* obj);
// Objects that are stable by identity: modules, functions, classes, builtins, descriptors.
bool is_identity_object(PyObject* obj);

// Numbers one place (a compile context's entry pc) specialised, by source text: the value of the
// first compile that pinned each. A later compile there that finds another value marks it
// varying, and from then on it is a run-time number at that place (automatic dynamic, as sizes
// are for backends that compile per size). Ints in the middle of a frame (a loop counter, a
// config value held in a local across a break) are pinned by the size tracker where Python
// needs their value; floats read by source (a learning rate a scheduler changes in the
// optimizer's param group, a scale argument) are specialised by EntryState until they vary.
// Kept by the runtime (CodeState), one per place.
struct PinnedNumbers {
  std::unordered_map<std::string, py::object> first;
  std::unordered_set<std::string> varying;
};

class EntryState {
 public:
  // Borrowed: the frame's pieces (they outlive the trace). Tensors read from the frame become
  // placeholders of `recorder`'s graph.
  EntryState(const FrameState& frame, int entry_pc, GraphRecorder& recorder);
  EntryState(const EntryState&) = delete;
  EntryState& operator=(const EntryState&) = delete;

  const FrameState& frame() const { return frame_; }
  const SourceTable& sources() const { return sources_; }

  // Interns `source`, reads its live value and wraps it (guards, a placeholder for a tensor).
  // The same source always gives the same Value. nullptr (and the source forgotten) when it
  // cannot be read: an unbound local, a missing global, key or attribute.
  ValuePtr load(Source source);
  // The Value loaded from `slot`, nullptr if none.
  ValuePtr value_at(int slot) const {
    auto found = by_slot_.find(slot);
    return found == by_slot_.end() ? nullptr : found->second;
  }
  // The live value source `slot` was read as (Borrowed; held here). Only for loaded slots.
  PyObject* live_value(int slot) const;
  // Whether a source reads the frame's own state (locals, stack, items of those): numbers there
  // are not specialised in regions that start mid-frame.
  bool is_frame_state(int slot) const;
  // The source slot of a tensor placeholder, -1 if `node` is none.
  int slot_of_placeholder(Node* node) const;
  // Where numbers read by source are specialised until they vary (PinnedNumbers); nullptr
  // (the default): always specialised. Floats that vary are run-time numbers where `floats`
  // (backends that run the graph as it is); ints where `ints` (graph inputs wherever a size may
  // be one: Value::int_input), from the first compile where `ints_from_start` (dynamic=True).
  // Every int read is recorded either way, so a later trace knows whether it varied.
  void set_varying_numbers(PinnedNumbers* numbers, bool ints, bool ints_from_start, bool floats) {
    numbers_ = numbers;
    varying_ints_ = ints;
    ints_from_start_ = ints && ints_from_start;
    varying_floats_ = floats;
  }
  // Whether the number read from `slot` is one of the frame's own in a region that starts in
  // the middle of it (a loop counter, a local held across a break), not one read at its start.
  bool is_mid_frame_number(int slot) const { return entry_pc_ > 0 && is_frame_state(slot); }

  // Graph inputs in placeholder order: tensors by slot (added by load), scalar inputs as
  // expressions over slots (added by the size tracker).
  void add_input(Rebuild input) { inputs_.push_back(std::move(input)); }
  const std::vector<Rebuild>& inputs() const { return inputs_; }

  // ---- guards: what the region assumes about its entry state ----
  void guard_type(int slot, PyObject* type);
  void guard_id(int slot, PyObject* obj);
  void guard_const(int slot, PyObject* value);
  void guard_len(int slot, int64_t n);
  void guard_dict_contains(int slot, PyObject* key, bool present);
  void guard_dict_keys(int slot, PyObject* keys);  // Borrowed: keys, a tuple
  // Looking `name` up on class `type` (read from `slot`) finds something iff `present`.
  void guard_class_attribute(int slot, PyTypeObject* type, PyObject* name, bool present);
  // Looking `name` up on class `type` (read from `slot`) finds what it finds now (the method,
  // property or class value the trace bound): once per (slot, name).
  void guard_class_attribute_is(int slot, PyTypeObject* type, PyObject* name);
  // The int read from `slot` stays `REL bound` (a comparison the trace decided on it).
  void guard_int_relation(int slot, SizeRelation rel, int64_t bound) {
    guards_.add_int_relation(slot, rel, bound);
  }
  // sum(terms) + constant REL 0 over int inputs and input sizes stays true.
  // With a modulus: (sum(terms) + constant) % modulus REL remainder.
  void guard_linear_relation(std::vector<Guard::Term> terms, int64_t constant, SizeRelation rel,
                             int64_t modulus = 0, int64_t remainder = 0) {
    guards_.add_linear_relation(std::move(terms), constant, rel, modulus, remainder);
  }
  // The objects read from two sources are not the same object (the trace took them as two).
  void guard_distinct(int slot, int other) { guards_.add_distinct(slot, other); }
  // The objects read from two sources are one object.
  void guard_same(int slot, int other) { guards_.add_same(slot, other); }
  // Two input tensors' sizes compare as they did: slot's size(dim) REL other's size(other_dim).
  void guard_size_relation(int slot, int dim, SizeRelation rel, int other, int other_dim) {
    guards_.add_size_relation(slot, dim, rel, other, other_dim);
  }
  // Objects of the entry state that a write to `target` could also change if the caller passed
  // the same object twice: every other object of its type read by source (not modules,
  // classes, functions: those are guarded by identity), each guarded to stay a different
  // object than `target`.
  // (A tensor target, whose .`name` was written: only the other tensors whose .`name` the
  // region read.)
  void guard_not_aliased(const ValuePtr& target, const std::string& name);
  // The object read from `slot` is changed by the trace (a list or dict it writes back at the
  // exit): reading it through any other source is unsupported from now on (that value would
  // not show the change), as is a change when another source read it already.
  void note_changed(int slot);
  // Whether the trace changed obj's attribute dict in place (note_changed). Borrowed: obj.
  bool namespace_changed(PyObject* obj) const;
  // The frame's globals dict is `globals` (a region that writes a global relies on it).
  void guard_globals_dict(PyObject* globals);
  // For a backend that runs any size: tensor guards check no sizes but the input dimensions in
  // `fixed` (by source slot), which a size read into Python pinned.
  void allow_any_sizes(const std::map<int, std::set<int>>& fixed);
  // For a graph compiled with symbolic sizes (a backend that does not run any size itself):
  // tensor guards of the slots in `symbolic` check every size but those dims, and the layout.
  void allow_symbolic_dims(const std::map<int, std::set<int>>& symbolic);
  // After either: the dims a comparison the trace decided bounded stay within [lo, hi].
  void bound_dims(const std::map<int, std::vector<TensorSpec::DimRange>>& ranges);

  // The finished trace's sources and guards, moved out (the entry state is spent).
  SourceTable take_sources() { return std::move(sources_); }
  GuardSet take_guards() { return std::move(guards_); }

 private:
  ValuePtr wrap(int slot, py::handle real);
  // Whether the number read at `slot` is a run-time number: its source's value changed between
  // compiles of this place (numbers_).
  bool number_varies(int slot, PyObject* value);

  FrameState frame_;
  int entry_pc_;
  GraphRecorder& recorder_;
  SourceTable sources_;
  GuardSet guards_;
  std::vector<Ref> live_;  // live values by slot
  std::unordered_map<int, ValuePtr> by_slot_;
  std::unordered_map<Node*, int> tensor_slots_;  // tensor placeholder -> its source slot
  // A tensor or plain object wrapped once -> its first slot: read again through another source
  // (a parameter of the model and of the optimizer's param_groups) it is the same value, and
  // the second source is guarded to be the same object.
  std::unordered_map<PyObject*, int> slot_of_object_;
  std::vector<Rebuild> inputs_;
  std::set<std::pair<int, std::string>> class_attributes_guarded_;
  std::unordered_map<PyObject*, int> changed_;  // see note_changed: live object -> its slot
  PinnedNumbers* numbers_ = nullptr;
  bool varying_ints_ = false;
  bool ints_from_start_ = false;
  bool varying_floats_ = false;
};

}  // namespace framejit
