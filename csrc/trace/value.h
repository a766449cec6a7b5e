// Abstract values of the tracer: a small closed set of kinds, each with an optional source.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/py.h"

namespace framejit {

class Node;
struct TraceFrame;

enum class VKind : uint8_t {
  kTensor,  // a tensor: graph node + meta tensor + the real device
  kConst,   // an immutable Python value fixed at trace time (int, float, str, dtype, Size, ...)
  kObject,  // a Python object used by reference (module, function, class, input dict, ...)
  kTuple,   // tuple of values (pytype: tuple, a namedtuple or a structseq such as return_types)
  kList,    // list of values
  kDict,    // dict with constant keys
  kNull,    // the NULL CPython pushes before a callable
  kSymNum,  // a Python int/float whose value is not specialised: an entry value of a region that
            // starts mid-frame (e.g. the result of .item()), a tensor's size (sizes.cpp), or
            // arithmetic on such values
  kIter,    // an iterator being unrolled: `iter_form` says what it iterates
  kCell,    // a closure cell: `items` holds its content (empty: an empty cell); `source` set for a
            // cell that existed before the trace (read-only here)
};

const char* vkind_name(VKind kind);

struct Value;
using ValuePtr = std::shared_ptr<Value>;
// A keyword argument at a call: name and value.
using KwValues = std::vector<std::pair<std::string, ValuePtr>>;

// What a kObject stands for. Most are plain Python objects used by reference; the others exist
// only in the trace (or are the pieces of a bound method), and each role says what the fields
// hold. See grad_mode.cpp for the mode roles.
enum class ObjRole : uint8_t {
  kPlain,          // obj: the object; bound_self set: a Python function bound to that instance
  kTypeMethod,     // a method of the receiver's type (Tensor.add, list.append): obj: the function
                   // found on the type; method: its name; bound_self: the tensor when read by
                   // LOAD_ATTR (after LOAD_METHOD, self is the next stack entry)
  kProperty,       // obj: a property's getter; bound_self: the instance it is read from
  kMadeFunction,   // made by MAKE_FUNCTION (lambda, nested def, comprehension): obj: its code
                   // object; globals: its globals dict; items: defaults tuple, keyword defaults
                   // dict, closure tuple (kNull where absent)
  kNewObject,      // an instance of a plain user class created by the trace (`Point(x, y)`, a
                   // dataclass, a dict subclass such as ModelOutput): obj: the class; keys /
                   // items: its instance attributes so far; mapping: a dict subclass's items. A
                   // region exit that needs it builds a real one (_support.new_object)
  kAttrHook,       // obj.name where type(obj) defines __getattribute__ in Python: obj: that
                   // function; bound_self: the instance; method: the name (LOAD_ATTR inlines
                   // the call)
  kGenericGetattr, // super().__getattribute__ reaching object's: bound_self: the instance; a
                   // call looks the name up as object.__getattribute__ does
  kSuper,          // made by super(): obj: the class whose parents are searched (__class__ of the
                   // method); bound_self: the method's first argument
  kGradManager,    // torch.no_grad() / enable_grad() made in the trace: obj: the real manager,
                   // not yet entered
  kGradSet,        // torch.set_grad_enabled(mode) called in the trace (it switches at once):
                   // obj: (prev, mode)
  kGradExit,       // the __exit__ a `with` on a grad-mode manager pushes: obj: the mode it
                   // restores (a bool)
  kInferenceManager,  // torch.inference_mode(mode) made in the trace: obj: the real manager
  kInferenceExit,     // its `with`'s __exit__: obj: the trace-time context; node: the enter node
  kAutocastManager,   // torch.autocast(...) made in the trace: obj: the real manager; items:
                      // device_type, dtype, enabled, cache_enabled as given (None where not, so
                      // defaults are read when the graph runs)
  kAutocastExit,      // its `with`'s __exit__: obj: the trace-time mode; node: the enter node
  kPartial,           // functools.partial(f, *args, **kw) of values made in the trace: obj: the
                      // partial type; items: f, the args tuple, the keywords as a list of
                      // (name, value) pairs. A region exit that needs it builds a real one
                      // (_support.make_partial)
  kWithExit,          // the __exit__ a `with` on an object whose class defines __enter__ and
                      // __exit__ in Python pushes: obj: that __exit__ function; bound_self: the
                      // manager (a call inlines it; a region exit rebuilds it bound)
  kNullManager,       // a context manager with nothing the graph holds, made in the trace
                      // (profiler ranges, contextlib.nullcontext): obj: its class; items: the
                      // arguments it was made with
  kNullExit,          // its `with`'s __exit__: does nothing
  kContextToken,      // the Token of a ContextVar.set the trace made (trace/stdlib_calls.cpp):
                      // obj: the variable; over: its value before the set (nullptr: as at the
                      // region's entry). Never leaves the region: one that would is traced
                      // again with that set left to Python
  kIdentity,          // id(t) of a tensor input: obj: its id now; bound_self: the tensor. Only
                      // compared with another (`id(a) == id(b)` is `a is b`, guarded)
  kDictView,          // d.keys() / d.values() / d.items(): method: which; over: the dict (a
                      // kDict of the trace, read as it is whenever the view is used, or a dict
                      // read by source: items holds its guarded snapshot, a list value)
};

// What a kIter iterates. Each form reads its containers when it steps, as CPython's iterators
// do, so a loop body that changes the list or dict it iterates sees the change.
enum class IterForm : uint8_t {
  kItems,      // `items`, fixed when it was made (a tuple, a tensor's rows, a generator's yields;
               // with `over` set: a view of a dict read by source, rebuilt over that dict)
  kOver,       // the list or dict `over` (dict: `view` says keys, values or items)
  kRange,      // `lazy_range`, made one item at a time: range(10**6) holds no million values
  kEnumerate,  // (count, item) of the iterator items[0]; `count`: the next number
  kZip,        // a tuple of one item from each iterator in `items`, until one is exhausted
  kReversed,   // the list `over` from its end; `count`: the next index (-1: done)
  kGenerator,  // a generator function's frame the trace runs (`gen_frame`), suspended at a
               // yield or not yet started; it becomes kItems when it returns (trace/generators.cpp)
};

struct Value {
  VKind kind = VKind::kConst;
  int source = -1;           // slot in the trace's SourceTable, -1 if made during the trace
  py::object obj;            // kConst: the value; kObject: the object; kTensor: the meta tensor
  Node* node = nullptr;      // kTensor
  py::object device;         // kTensor: the real torch.device
  std::vector<ValuePtr> items;   // kTuple, kList, kDict (values)
  std::vector<py::object> keys;  // kDict; kIter kItems over a dict read by source: its keys
                                 // when the loop began
  bool ndarray = false;          // kTensor: stands for a NumPy array the trace made (x.numpy(), a
                                 // NumPy call on one): NumPy's semantics, an np.ndarray where it
                                 // leaves the region (trace/numpy_calls.cpp)
  // kTensor: its value where the trace computed it from numbers alone (a real CPU tensor of at
  // most one element: torch.div(n, 2, rounding_mode="trunc"), torch.tensor(d).sqrt()), as fake
  // tensors propagate constants; `known_from`: the run-time numbers (sizes) it was computed
  // from, pinned where the value is used (Tracer::known_value).
  // `known_version`: the meta tensor's version counter then; an in-place op on it or on a view
  // of it since (a step counter's `+= 1`) makes the value unknown.
  py::object known;
  std::vector<ValuePtr> known_from;
  int64_t known_version = -1;
  py::object pytype;             // kTuple: the exact tuple type; kTensor from a source: its type;
                                 // kDict made by collections.defaultdict: defaultdict, made by
                                 // collections.OrderedDict: OrderedDict; kIter: types.GeneratorType
                                 // for a generator's (a generator function's, a module listing's);
                                 // kList made by collections.deque: deque (is_deque)
  Py_ssize_t maxlen = -1;        // kList made by collections.deque: its maxlen, -1 for none
  ValuePtr factory;              // kDict made by collections.defaultdict: its default_factory
                                 // (a constant, or any callable value of the trace)
  ObjRole role = ObjRole::kPlain;  // kObject: what it stands for (see ObjRole)
  std::string method;            // kObject kTypeMethod: the method's name
  py::object globals;            // kObject kMadeFunction: the function's globals dict
  bool frozen = false;           // kCell: a copy of a real cell's content, never stored into;
                                 // kDict: a copy of a new object's attributes (its __dict__)
                                 // or of class data; kList, kObject: class data (class_data)
  std::weak_ptr<Value> own_function;  // kCell whose content is a function made in the trace
                                      // that closes over this very cell (a recursive nested
                                      // def): held here weakly, by the tracer strongly
  py::object fn;                 // kSymNum computed by arithmetic: the operator function
  IterForm iter_form = IterForm::kItems;  // kIter
  size_t index = 0;              // kIter kItems / kOver / kRange: items consumed so far
  int64_t count = 0;             // kIter kEnumerate / kReversed (see IterForm)
  char view = 'k';               // kIter kOver a dict: 'k' keys, 'v' values, 'i' (key, value)
  bool exhausted = false;        // kIter: it said stop once, and stays so (as CPython's do)
  py::object lazy_range;         // kIter kRange
  ValuePtr over;                 // kIter kOver / kReversed: the list or dict value of the
                                 // trace; kObject kDictView: its dict
  size_t over_size = 0;          // kIter kOver a dict: its size when the loop started
  std::vector<std::weak_ptr<Value>> iterators;  // kDict (or a dict read by source): the
                                 // iterators made over it; while one of them is unfinished, a
                                 // change of its size ends the region first, so the real
                                 // iterator raises as in Python (see being_iterated)
  bool adopted = false;          // kList / kDict read by source that the trace changes: its
                                 // contents are the trace's, written into the real object at
                                 // the exit (Tracer::make_writable)
  int memo = -1;                 // exit rebuilding: the memo slot of a container, -1 if none
  ValuePtr bound_self;           // kObject holding a Python function bound to an instance
  ValuePtr wrapped;              // kObject kMadeFunction decorated by functools.wraps(wrapped):
                                 // functools.update_wrapper runs where it is rebuilt
  ValuePtr origin;               // kObject kNewObject: the class value it was made from (guards
                                 // on the class's methods are read through it)
  py::object remake;             // kObject made at trace time by a constructor the exit calls
                                 // again for a fresh one (nn.CrossEntropyLoss()): the
                                 // (class, args, kwargs) of _support.remake
  ValuePtr cause;                // kObject exception with a remake, raised `from` another (or
                                 // None) in the trace: its __cause__, set again when remade
  ValuePtr class_of;             // kObject function read off the class of this value (or off
                                 // this class), which has a source: the trace reads the
                                 // function's closure through it (Tracer::function_source)
  std::string class_attr;        // ... under this name
  ValuePtr dict_of;              // kDict, a frozen copy of an object's __dict__ (obj.__dict__ of
                                 // an object the trace made): that object, whose real __dict__
                                 // the exit gives in the copy's place
  ValuePtr mapping;              // kObject kNewObject of a dict subclass (ModelOutput): its
                                 // items, a kDict of the trace
  ValuePtr size_of;              // kSymNum leaf: size `size_dim` of this tensor value
  int size_dim = -1;
  bool int_input = false;        // kSymNum leaf: an int read by source at the frame's start
                                 // that varies between calls (a position or step argument):
                                 // a graph input wherever a size may be one
  std::shared_ptr<TraceFrame> gen_frame;  // kIter kGenerator

  static ValuePtr constant(py::object value, int source = -1);
  static ValuePtr object(py::object value, int source = -1);
  static ValuePtr tensor(Node* node, py::object meta, py::object device, int source = -1);
  // The same graph value as a torch tensor: a NumPy array of the trace (`ndarray`) copied
  // without the mark; any other value itself.
  static ValuePtr plain_tensor(const ValuePtr& value);
  static ValuePtr tuple(std::vector<ValuePtr> items, py::object pytype = py::object());
  static ValuePtr list(std::vector<ValuePtr> items);
  static ValuePtr dict(std::vector<py::object> keys, std::vector<ValuePtr> values);
  // A Python value known at trace time: its lists, tuples and dicts (exact types, 8 levels
  // deep) as containers of the trace, so their methods and iteration are the trace's; anything
  // else a constant as it is.
  static ValuePtr constant_tree(py::object value, int depth = 0);
  static ValuePtr null();
  // A number computed as fn(*args) from other numbers, `value` its trace-time result.
  static ValuePtr sym_num(py::object fn, std::vector<ValuePtr> args, py::object value);
  static ValuePtr iter(std::vector<ValuePtr> items);
  // An iterator that is a generator to Python (type() / isinstance see types.GeneratorType): a
  // generator function's frame, a generator expression's yields, a module listing.
  static ValuePtr generator_iter(std::vector<ValuePtr> items);
  // An iterator over a list or dict value of the trace, read as it is at each step.
  static ValuePtr iter_over(const ValuePtr& container, char view = 'k');

  // kDict: the index of `key` among keys (compared with ==), -1 if absent.
  long find_key(const py::object& key) const;
  // kDict: d[key] = value, a new key added last; a dict a loop iterates may not grow (the
  // region ends first, so the real iterator raises as in Python).
  void set_key(py::object key, ValuePtr value);
  // kDict (or a dict read by source): an iterator made over it is alive and not exhausted
  // (a finished loop's does not count: an exhausted dict iterator stays so in Python).
  bool being_iterated() const;
  void add_iterator(const ValuePtr& it) { iterators.push_back(it); }

  bool is_tensor() const { return kind == VKind::kTensor; }
  bool is_const() const { return kind == VKind::kConst; }
  bool is_sequence() const { return kind == VKind::kTuple || kind == VKind::kList; }
  // A kObject in this role (a plain object: role kPlain).
  bool is(ObjRole r) const { return kind == VKind::kObject && role == r; }
  // A dict of the trace made as a collections.OrderedDict (its views, its rebuild, popitem).
  bool is_ordered_dict() const;
  // A list of the trace made as a collections.deque (its methods, its rebuild as a deque).
  bool is_deque() const { return kind == VKind::kList && static_cast<bool>(pytype); }
  // A deque's maxlen as deque() takes it: None or an int.
  py::object deque_maxlen() const { return maxlen < 0 ? py::object(py::none()) : py::object(py::int_(maxlen)); }
  // A kObject that is not a plain object (a trace-only object or a bound method's piece).
  bool is_special_object() const { return kind == VKind::kObject && role != ObjRole::kPlain; }
  // A number computed from tensor sizes, int inputs and constants only (no other run-time
  // entry numbers).
  bool is_size_expr() const;
  // Whether a size expression occurs anywhere in this value (containers searched).
  bool holds_size_expr() const;
  // Whether a number known only at run time (a kSymNum) occurs anywhere in this value.
  bool holds_sym_num() const;
  // Whether a tensor is this value or among its items (containers, iterators), recursively.
  bool holds_tensor() const;
  // Whether this value (recursively) is fully known at trace time.
  bool is_constant_tree() const;
  // What a dict lookup hashes, known at trace time: a constant tree's Python value, or an
  // object that hashes by identity and that the guards fix (a class: `registry.get(type(x))`,
  // a function, a module). False for anything else.
  bool as_key(py::object& out) const;
  // The Python value of a constant tree (tuples/lists/dicts rebuilt). Requires is_constant_tree.
  py::object as_python() const;

  // kIter: the next item (nullptr once exhausted); the items it has left, at most `max`, read
  // on a copy so nothing is consumed (false if there are more than `max`); consuming the rest.
  // Each throws GeneratorNeeded, consuming nothing, when an item must come from a generator
  // the trace has not run yet (live_generator): next() for one more item, rest() for all.
  ValuePtr next();
  bool rest(size_t max, std::vector<ValuePtr>& out) const;
  void exhaust();
  // kIter: the generator this iterator (or a zip / enumerate of it) would have to run to step
  // (to its end: `all`), nullptr if none. A generator's `items` from `index` on are the items
  // it yielded ahead of its consumer (GenMode::kBuffer), handed out before it runs again.
  Value* live_generator(bool all = false);
  // A generator with no item yielded ahead: stepping it runs its frame.
  bool generator_waits() const {
    return kind == VKind::kIter && iter_form == IterForm::kGenerator && !exhausted && index >= items.size();
  }

  // This container with fn applied to each item: itself if no item changed, else a copy (made
  // during the trace: no source). Values other than tuples, lists and dicts: itself.
  static ValuePtr map_items(const ValuePtr& value,
                            const std::function<ValuePtr(const ValuePtr&)>& fn);

  // "Tensor(f32[2, 3])", "Const(3)", "Object(<module 'torch'>)": for messages.
  std::string describe() const;
};

// Thrown by Value::next / rest when a live generator must run first: the tracer runs that
// generator's frame to its next yield (or, with `all`, to its end), the items kept on the
// iterator, and executes the instruction again (Tracer::run).
struct GeneratorNeeded {
  Value* generator;
  bool all = false;
};

// A live generator (kIter kGenerator, not finished) that `value` is or holds (in its containers
// and iterators), nullptr if none.
Value* live_generator_in(const ValuePtr& value);
// A ContextVar token of the trace (ObjRole::kContextToken) in `value` or what it holds, else
// nullptr.
Value* context_token_in(const ValuePtr& value);

// The items a kDictView yields now.
std::vector<ValuePtr> dict_view_items(const Value& view);

}  // namespace framejit
