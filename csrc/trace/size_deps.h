// Which input sizes a size in the graph depends on: the walk behind per-dimension size guards.
//
// When Python needs a size (a branch, range(), a split's number of results), the trace holds
// only for the input sizes that size is computed from. Walking back from the size through the
// nodes that made its tensor finds them: `x.size(1)` of an input is that input's dim 1; the
// batch dim of `linear(x, w)` is x's, its last dim w's dim 0; an op framejit knows no shape
// rule for depends on every size of every argument (a superset, so always safe).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "graph/graph.h"

namespace framejit {

struct SizeDeps {
  std::set<std::pair<Node*, int>> dims;  // (tensor placeholder, dim)
  std::set<Node*> numbers;               // number placeholders (a run-time float in a shape)
  bool all = false;                      // unknown: every size of every input counts
};

// Whether a node's rank is the same for all input sizes, by node (filled by the walks).
using RankMemo = std::unordered_map<Node*, bool>;

// Graph numbers (size expressions: x.size(1), sums of them) times ints plus an int.
struct NumberSum {
  std::map<Node*, int64_t> terms;  // number node -> factor != 0
  int64_t offset = 0;
};

// What the trace knows about graph nodes beyond their ops' rules.
struct NodeFacts {
  // Nodes whose tensor changed shape in place after they were made (x.t_(), an out= argument):
  // their sizes depend on anything.
  std::unordered_set<Node*> reshaped;
  // Sizes that, for every input the region's guards admit, are a sum of graph numbers: a slice
  // whose bounds differ by that (`table[pos : pos + T]` is T long) within the tensor it is
  // taken from (SizeTracker::guard_used_lengths guards that once a walk uses it), by (node, dim).
  std::map<std::pair<Node*, int>, NumberSum> lengths;
  // Those the walks relied on (their guards are then due).
  mutable std::set<std::pair<Node*, int>> used;
};

// Adds to `out` what size `dim` of tensor node `node` depends on; dim -1: every size of a
// tensor node, or the value of a number node (a size expression).
void add_size_deps(Node* node, int dim, const NodeFacts& facts,
                   RankMemo& ranks, SizeDeps& out);

// A size known exactly from input sizes: the sum of factor * size `dim` of a tensor
// placeholder, plus a constant. `q.shape[2]` after `x.view(B, T, nh, hs).transpose(1, 2)` is
// 1 * x's size 1; the key of a cache concatenated onto the new keys is past + new.
struct LinearSize {
  std::map<std::pair<Node*, int>, int64_t> terms;  // (tensor placeholder, dim) -> factor != 0
  int64_t offset = 0;
  // Input sizes the sum holds for only while they are not 1 (x + pos where pos's size is not
  // known exactly: the broadcast is x's size unless that is 1); whoever relies on the sum
  // guards them.
  std::set<std::pair<Node*, int>> not_one;
  // Input sizes the sum takes as the constants they are now (a parameter's size multiplying
  // another size: view(B, -1, heads, d) of a (B, T, hidden) tensor is T * hidden / (heads * d));
  // whoever relies on the sum pins them.
  std::set<std::pair<Node*, int>> pinned;
  bool operator==(const LinearSize& other) const;  // the same sum (conditions aside)
};
// Results of exact_size by (node, dim), valid while no node is added to `reshaped`.
using ExactMemo = std::map<std::pair<Node*, int>, std::optional<LinearSize>>;

// A size no sum of input sizes gives, but a monotone function of one size `in` does: the
// spatial size of a convolution or a pooling, floor((in + add) / divisor) + 1 (`add` is twice
// the padding less the kernel's span; padding="same": `in` itself), of an interpolation by a
// scale factor, floor(in * scale) as torch computes it in doubles, or the length of a
// constant slice of a dimension `in` long (`h[:, :, :-1]`, `x[2:]`; start < 0 with stop >= 0,
// the one form whose length is not monotone in `in`, is none). As `in` grows the size never
// shrinks, and `in` is a sum of input sizes and other atoms, so a comparison of such a size
// with a constant holds on a range of one input size (SizeTracker::decide).
struct SizeAtom {
  enum class Kind { kWindow, kSlice, kScale };
  Kind kind = Kind::kWindow;
  LinearSize in;
  int64_t add = 0, divisor = 1, plus = 1;  // kWindow: floor((in + add) / divisor) + plus
  std::optional<int64_t> start, stop;      // kSlice: in[start:stop:step] (None: nullopt)
  int64_t step = 1;
  double scale = 1;                        // kScale: floor(in * scale), scale > 0 (interpolate)
  // The size for `in` = value (any int: the function extends to all of them, still monotone).
  __int128 at(__int128 value) const;
};
// Atoms by the (node, dim) term that stands for them in a LinearSize.
using SizeAtoms = std::map<std::pair<Node*, int>, SizeAtom>;

// Size `dim` of tensor node `node` (dim -1: the value of an int node) as a LinearSize, where
// the rules of the ops that made it say exactly what it is (a transpose moves a size, a view
// takes its size expression, cat adds its pieces', broadcasting keeps the one that is not 1,
// a size that depends on no input is a constant); nullopt where they do not. Sizes of the
// placeholders `pinnable` accepts may be taken as constants where a product needs them to be.
// With `atoms` (and a memo of its own), a size that is a SizeAtom is a term of its own, keyed
// by its node and dim (no placeholder), and its definition is added to `atoms`.
std::optional<LinearSize> exact_size(Node* node, int dim, const NodeFacts& facts,
                                     RankMemo& ranks, ExactMemo& memo,
                                     const std::function<bool(Node*)>& pinnable,
                                     SizeAtoms* atoms = nullptr);

// Adds to `out` what the number of tensors a split / chunk / unbind node returns depends on:
// the input sizes of the split dimension's size where that is exact (a chunk of a parameter's
// size: the parameter's, pinned), else what it is computed from. The exact size holds while
// the placeholder sizes added to `not_one` are not 1 (placeholders all: the caller guards them).
void add_split_count_deps(Node* split, const NodeFacts& facts, RankMemo& ranks,
                          ExactMemo& memo, const std::function<bool(Node*)>& pinnable,
                          SizeDeps& out, std::set<std::pair<Node*, int>>& not_one);

// A dimension of a tensor indexed with a slice the graph makes whose bounds differ by a sum of
// graph numbers no int input is in: stop - start = `length` (`x[:, s : s + 1]`,
// `freqs[pos : pos + T]`, `h[:, T - 1 : T]`), step 1, and the trace's result that long there.
// It is that long for other bounds while 0 <= start <= stop <= the input's size `in_dim`,
// which whoever relies on it guards.
struct FixedSlice {
  int out_dim = -1;
  int in_dim = -1;
  Node* slice = nullptr;  // the node making the slice
  NumberSum length;
};
// Those dimensions of getitem node `node` (none where it is no such index).
std::vector<FixedSlice> fixed_length_slices(const Node* node);

}  // namespace framejit
