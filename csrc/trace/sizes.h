// The size tracker: numbers that come from tensor sizes (and numbers known only at run time)
// while the trace runs. A size read by traced code is a size expression that stays a graph value
// while it only flows into torch calls; where Python needs the number, `specialize` pins it and
// the input dimensions it is computed from are recorded for the guards (size_deps.h).
#pragma once

#include <functional>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "common/py.h"
#include "guards/tensor_check.h"
#include "trace/entry_state.h"
#include "trace/recorder.h"
#include "trace/size_deps.h"
#include "trace/value.h"

namespace framejit {

class SizeTracker {
 public:
  SizeTracker(EntryState& entry, GraphRecorder& recorder);
  SizeTracker(const SizeTracker&) = delete;
  SizeTracker& operator=(const SizeTracker&) = delete;

  // Whether sizes read from tensors stay graph values until Python needs their value (only for
  // backends that run any size).
  void set_symbolic(bool on) { symbolic_ = on; }
  bool symbolic() const { return symbolic_; }
  // Whether a float known only at run time may become a graph input (scalar_input). Backends
  // that compile per size may bake an example number into their code (inductor does), so for
  // them such a float is pinned and guarded instead.
  void set_number_inputs(bool on) { number_inputs_ = on; }
  bool number_inputs() const { return number_inputs_; }
  // Where a number in the middle of the frame may be pinned when Python needs its value (see
  // PinnedNumbers); nullptr (the default): never, it stays a run-time number.
  void set_pinned_numbers(PinnedNumbers* pinned) { pinned_numbers_ = pinned; }

  // Size `dim` of a tensor value: a size expression (symbolic), or a constant that specialises
  // the trace's sizes. `how` names the read for the guards log.
  ValuePtr tensor_size(const ValuePtr& tensor, int64_t dim, const std::string& how);
  // x.shape / x.size(): a torch.Size of tensor_size() items.
  // x.numel(): the product of its sizes, each a size expression where sizes are symbolic (so
  // `x.numel() == 0` guards a relation and pins nothing), else the number.
  ValuePtr tensor_numel(const ValuePtr& tensor);
  ValuePtr tensor_shape(const ValuePtr& tensor, const std::string& how);
  // The graph node computing a size expression (x.size(0), then operator nodes), made once.
  Node* size_node(const ValuePtr& value);
  // The graph input standing for a float SymNum used in a torch call (one per value).
  ValuePtr scalar_input(const ValuePtr& value);

  // Pins a number to its trace-time value (guards on every source it came from; a size in it
  // pins the input dimensions it is computed from).
  ValuePtr specialize(const ValuePtr& value);
  // A size expression Python branches on (`if`, `assert`, `and`): a comparison of an input's
  // own size with a constant int (`assert t <= block_size`, `t != 1`) keeps that dim free
  // where it gives the same answer (dim_ranges), a comparison of two inputs' own sizes
  // (`kv_length > q_length`) is guarded as that relation; anything else is specialize()d.
  ValuePtr decide(const ValuePtr& value);
  // The value with every size expression in it pinned to its trace-time value, and every number
  // of the entry state this place has not seen change (PinnedNumbers).
  ValuePtr concretize(const ValuePtr& value);
  // `value` (a number holding entry numbers) pinned where this place has seen none of them
  // change, recording their values; nullptr where one varies (it stays a run-time number), or
  // where no place keeps such a record (dynamic=True).
  ValuePtr pin_steady_number(const ValuePtr& value);
  // Whether `value` holds an int input of the frame's own (a local of a region that starts
  // mid-frame, seen to change): where Python needs its value it stays a run-time number (the
  // region ends there, a branch on it is a branch exit), as such numbers do, rather than being
  // pinned or guarded per value like an int input read by source.
  bool holds_frame_int(const ValuePtr& value) const;
  // Its value, where every number of the entry state in it was pinned already in this trace
  // (its guard is there: a branch on it costs nothing more); nullptr otherwise.
  ValuePtr pinned_already(const ValuePtr& value);
  // slice(start, stop[, step]) of the trace (BUILD_SLICE, BINARY_SLICE): with a size expression
  // among the bounds (`x[:, 0:T]`), a size expression of its own whose node makes the slice, so
  // a tensor indexed with it takes any T (anything else pins it: concretize); else a constant.
  ValuePtr slice_of(std::vector<ValuePtr> parts);
  // Whether `value` is such a slice.
  static bool is_symbolic_slice(const ValuePtr& value);
  // After `result` = `base`[`key`] was recorded: a dimension sliced with bounds that differ by
  // sizes or a constant (`freqs[pos : pos + T]`, fixed_length_slices) is that long for any
  // bounds with 0 <= start <= stop <= base's size there. The walks take it as that
  // (NodeFacts::lengths), so Python reading it (`assert freqs.shape == (T, d)`) pins no
  // position; those conditions are guarded when a walk first relies on it (a range of an
  // int input, of a size, a relation of sizes: guard_used_lengths).
  void note_slice_lengths(const ValuePtr& result, const ValuePtr& base, const ValuePtr& key);
  // Arguments of a call answered at trace time (a metadata query): every number known only at
  // run time, sizes included, pinned (also inside containers).
  void make_constant_args(std::vector<ValuePtr>& args, KwValues& kwargs);
  // After an in-place op on `tensor` that may change its shape (x.t_(), x.unsqueeze_(0)): the
  // sizes read from it before are pinned (they are what they were, not what it has now).
  void pin_sizes_of(const ValuePtr& tensor, const std::string& why);

  // A size (or something computed from sizes) became a Python value and the walk cannot say
  // which: the trace holds for these sizes only. `what` says how, for the guards log.
  void note_size_read(const std::string& what) {
    if (size_read_.empty()) size_read_ = what;
  }
  // Size `dim` of `tensor` (-1: all its sizes) became a Python value: the input sizes it is
  // computed from are pinned (SizeDeps), or all of them if the walk cannot tell.
  void note_dim_read(const ValuePtr& tensor, int dim, const std::string& what);
  // Every size of `tensor` (numel, nbytes) became a Python value.
  void note_sizes_read(const ValuePtr& tensor, const std::string& what);
  // How many tensors the split / chunk / unbind node `split` returns depends on sizes.
  void note_split_count(Node* split, const std::string& what);

  bool sizes_read() const { return !size_read_.empty(); }
  const std::string& size_read() const { return size_read_; }
  // The input dimensions pinned so far, by source slot, and for each the read that pinned it
  // ("L['x'].size(1): a size used as a Python value at model.py:12"), for the guards log.
  const std::map<int, std::set<int>>& pinned_dims() const { return pinned_dims_; }
  const std::vector<std::string>& dim_reads() const { return dim_reads_; }
  // The input dimensions a comparison bounded, by source slot.
  const std::map<int, std::vector<TensorSpec::DimRange>>& dim_ranges() const { return dim_ranges_; }

 private:
  void note_size_deps(SizeDeps& deps, const std::string& what);
  // decide() for a product of input sizes compared with 0 (`x.numel() == 0`) where the answer
  // is "not empty": each size guarded at least 1; nullptr for anything else.
  ValuePtr decide_empty(const ValuePtr& value, SizeRelation rel);
  // The size expression leaf for size `dim` (whose value now is `value`) of a tensor, made once.
  ValuePtr size_leaf(const ValuePtr& tensor, int64_t dim, py::handle value);

  EntryState& entry_;
  GraphRecorder& recorder_;
  bool symbolic_ = false;
  bool number_inputs_ = true;
  PinnedNumbers* pinned_numbers_ = nullptr;
  std::set<std::tuple<int, int, int64_t>> int_ranges_;  // (slot, relation, bound) guarded
  std::set<int> pinned_sources_;  // entry numbers specialize() guarded, by source slot
  std::string size_read_;  // the first read that pinned every size, "" if none
  std::vector<std::string> dim_reads_;
  std::map<int, std::set<int>> pinned_dims_;
  std::map<int, std::vector<TensorSpec::DimRange>> dim_ranges_;
  // The input size a size expression is, as (slot, dim), or (-1, -1): a size read straight from
  // a graph input that no in-place op reshaped.
  std::pair<int, int> input_size_of(const ValuePtr& value) const;
  // decide() for `size REL c` (not ==): a range of that size, guarded; the comparison's result.
  ValuePtr size_range(const ValuePtr& value, std::pair<int, int> size, SizeRelation rel, int64_t c);
  // Guards input size (slot, dim) REL c, shown in the guards log as `what` here.
  void guard_range(std::pair<int, int> size, SizeRelation rel, int64_t c, const std::string& what);
  // Nodes whose tensor changed shape in place after they were made (x.t_(), x.unsqueeze_(0)),
  // and the lengths of slices the walks take as sums of sizes (see NodeFacts).
  NodeFacts facts_;
  // The bounds of the slices in facts_.lengths no guard checks yet, and the size they are taken
  // from; guard_used_lengths() guards those a walk used.
  struct SliceBounds {
    ValuePtr start, stop, size;
    // What makes the slice stop - start long: 0 <= start <= stop <= size (a None start:
    // 0 <= stop <= size), as (lhs, rhs) of lhs <= rhs.
    std::vector<std::pair<ValuePtr, ValuePtr>> conditions() const;
  };
  std::map<std::pair<Node*, int>, SliceBounds> unguarded_lengths_;
  void guard_used_lengths();
  RankMemo ranks_;
  ExactMemo exact_;
  // Size `size_dim` of the tensor `value` is a size of, as exact input sizes (exact_size), where
  // module state's sizes may count as constants (pinned by whoever relies on the result).
  // With `atoms`, in atom mode (exact_size).
  std::optional<LinearSize> exact_size_of(const ValuePtr& value, SizeAtoms* atoms = nullptr);
  // A comparison decide() takes as `form` REL 0: factor * term summed, plus offset.
  struct FormTerm {
    int64_t factor = 0;
    int slot = -1;  // the input slot of a placeholder's size or an int input, -1 for any other size
    int dim = -1;
    bool int_input = false;  // an int input's value (Value::int_input), not a size
  };
  struct SizeForm {
    std::map<std::pair<const void*, int>, FormTerm> terms;  // by (node or value, dim)
    std::set<std::pair<Node*, int>> not_one;  // conditions of the exact sizes used (LinearSize)
    SizeDeps pinned;                          // module state sizes they took as constants
    int64_t offset = 0;
  };
  // Adds `v` times `scale` to `form`: ints, sizes (as exact input sizes where exact_size_of
  // knows them, else as themselves: they cancel only against themselves), int inputs, and + -
  // and * by an int of those; false for anything else.
  bool linear_form(const ValuePtr& v, int64_t scale, SizeForm& form, SizeAtoms* atoms);
  // decide() for a comparison of a size that is a chain of SizeAtoms over one input size (a
  // convolution's output length against 1) whose relation `rel` holds: the range of that
  // input size with the same answer, guarded; nullptr where the comparison is no such thing.
  ValuePtr decide_by_atoms(const ValuePtr& value, SizeRelation rel);
  // decide() for `(sum) % k REL c` with the sum of input sizes and int inputs (diffusers'
  // `dim % 2 ** n != 0`, a step counter's `step % every == 0`): guarded as that (a linear
  // relation with a modulus); nullptr for anything else.
  ValuePtr decide_modulo(const ValuePtr& value, SizeRelation rel);
  // Guards `sum(factor * input size or int input) + offset REL 0` (with a modulus: `(...) %
  // modulus REL remainder`) and notes it among the reads the log lists.
  void guard_linear(std::vector<Guard::Term> sum, int64_t offset, SizeRelation rel, int64_t modulus,
                    int64_t remainder);
  // A placeholder for a parameter or a module's buffer: sizes that change only when the model
  // does (torch.compile keeps them static), which a product of sizes may take as constants.
  bool is_module_state(Node* node) const;
  const std::function<bool(Node*)> module_state_ = [this](Node* n) { return is_module_state(n); };
  // Size expression leaves by (tensor node, dim), and the graph nodes made for size expressions.
  std::map<std::pair<Node*, int64_t>, ValuePtr> size_leaves_;
  // Keyed by address, so each entry holds its key alive: a freed Value's address is reused.
  std::unordered_map<const Value*, std::pair<ValuePtr, Node*>> size_nodes_;
  // Key (held alive, as above) -> the graph input standing for it.
  std::unordered_map<const Value*, std::pair<ValuePtr, ValuePtr>> scalar_inputs_;
};

}  // namespace framejit
