// Rebuilding the Python state at a region's exit from graph outputs, sources and constants.
#include "trace/exit_builder.h"

#include "common/check.h"
#include "trace/pyrefs.h"

namespace framejit {

void ExitBuilder::add_writes(const SideEffects& effects) {
  for (const PendingWrite& write : effects.writes()) {
    if (write.key) {  // dict[key] = value
      exit_.attr_writes.push_back({rebuild_of(write.target), py::str("[]"), rebuild_of(write.value),
                                   false, true, rebuild_of(write.key)});
      continue;
    }
    exit_.attr_writes.push_back(
        {rebuild_of(write.target), py::str(write.name), rebuild_of(write.value), write.generic});
  }
  for (const ValuePtr& container : effects.adopted()) {
    // The list or dict the trace changed: its contents now, put into the real object (named
    // None: the runtime replaces the contents rather than setting an attribute).
    Rebuild contents;
    contents.kind = container->kind == VKind::kList ? Rebuild::Kind::kList : Rebuild::Kind::kDict;
    contents.keys = container->keys;
    for (const auto& item : container->items) contents.items.push_back(rebuild_of(item));
    exit_.attr_writes.push_back({Rebuild::slot(container->source), py::none(), std::move(contents)});
  }
}

Rebuild ExitBuilder::memoised(Rebuild r, const ValuePtr& value) {
  // One object however often it is referenced (a list held by two locals stays one list).
  if (value->memo < 0) value->memo = exit_.memo_size++;
  r.memo = value->memo;
  return r;
}

Rebuild ExitBuilder::iterator_rebuild(const ValuePtr& it) {
  py::module_ builtins = py::module_::import("builtins");
  auto items_iter = [&](size_t from) {  // iter((item, ...)) of the items it has left
    Rebuild tuple;
    tuple.kind = Rebuild::Kind::kTuple;
    tuple.value = py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(&PyTuple_Type));
    for (size_t i = from; !it->exhausted && i < it->items.size(); ++i) {
      tuple.items.push_back(rebuild_of(it->items[i]));
    }
    return Rebuild::call(builtins.attr("iter"), {std::move(tuple)});
  };
  switch (it->iter_form) {
    case IterForm::kItems:
      if (!it->over) return items_iter(it->index);
      [[fallthrough]];  // the snapshot of a sourced dict: a real iterator over that dict
    case IterForm::kOver: {
      // A real iterator over the rebuilt list or dict, at the same position: later changes of
      // the container are seen (or, for a dict that changes size, raise) as in Python.
      if (it->exhausted) return items_iter(0);
      const char* view = it->view == 'v' ? "values" : it->view == 'i' ? "items" : "keys";
      return Rebuild::call(PyRefs::get().support.attr("iterator_at"),
                           {rebuild_of(it->over), Rebuild::constant(py::int_(it->index)),
                            Rebuild::constant(py::str(view))});
    }
    case IterForm::kRange: {  // iter(range[index:]): the rest of the range, still a range
      py::object rest = it->lazy_range[py::slice(py::int_(it->index), py::none(), py::none())];
      return Rebuild::call(builtins.attr("iter"), {Rebuild::constant(rest)});
    }
    case IterForm::kEnumerate:
      return Rebuild::call(builtins.attr("enumerate"),
                           {rebuild_of(it->items.at(0)), Rebuild::constant(py::int_(it->count))});
    case IterForm::kZip: {
      std::vector<Rebuild> inners;
      for (const ValuePtr& inner : it->items) inners.push_back(rebuild_of(inner));
      return Rebuild::call(builtins.attr("zip"), std::move(inners));
    }
    case IterForm::kReversed:
      return Rebuild::call(PyRefs::get().support.attr("reversed_at"),
                           {rebuild_of(it->over), Rebuild::constant(py::int_(it->count))});
    case IterForm::kGenerator:
      // Kept out of the root frame's state (Tracer::check_root_state_at_exit); reached only
      // through state the trace writes (an attribute holding it).
      throw InternalError("a generator the trace runs outlives its region");
  }
  throw InternalError("unknown iterator form at exit");
}

Rebuild ExitBuilder::rebuild_of(const ValuePtr& value) {
  // A value that holds itself (through cells, containers) cannot be rebuilt from its parts.
  struct Depth {
    int& depth;
    explicit Depth(int& d) : depth(d) {
      if (++depth > kMaxDepth) {
        --depth;
        throw InternalError("a value at the region's exit holds itself");
      }
    }
    ~Depth() { --depth; }
  } depth(depth_);
  if (value->kind == VKind::kTensor && value->ndarray) {
    // A NumPy array of the trace: the np.ndarray over the tensor it is in the graph (an
    // input's, read again from its source, or an output's).
    static PyObject* const kToNdarray =  // (never released: interpreter teardown order)
        py::object(py::module_::import("framejit._numpy").attr("to_ndarray")).release().ptr();
    return memoised(Rebuild::call(py::reinterpret_borrow<py::object>(kToNdarray),
                                  {rebuild_of(Value::plain_tensor(value))}),
                    value);
  }
  // An entry-state value passed on unchanged keeps its identity: read it again from its source.
  const bool from_source =
      value->source >= 0 && value->node == nullptr &&
      !(value->kind == VKind::kSymNum && value->fn);
  if (from_source || (value->kind == VKind::kTensor && value->node->kind == NodeKind::kPlaceholder &&
                      value->source >= 0)) {
    return Rebuild::slot(value->source);
  }
  Rebuild r;
  switch (value->kind) {
    case VKind::kTensor: {
      auto it = output_index_.find(value->node);
      if (it == output_index_.end()) {
        it = output_index_.emplace(value->node, static_cast<int>(outputs_.size())).first;
        outputs_.push_back(Arg::of(value->node));
      }
      r.kind = Rebuild::Kind::kOutput;
      r.index = it->second;
      return r;
    }
    case VKind::kConst: {
      PyObject* obj = value->obj.ptr();
      if (PyList_CheckExact(obj) || PyDict_CheckExact(obj) || PySet_CheckExact(obj) ||
          PyByteArray_CheckExact(obj)) {
        // A mutable object folded at trace time (`l + [0.5]`): a new copy on every run, never
        // the one object shared by every call.
        py::object type = py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(Py_TYPE(obj)));
        return memoised(Rebuild::call(type, {Rebuild::constant(value->obj)}), value);
      }
      return Rebuild::constant(value->obj);
    }
    case VKind::kObject:
      // (kept out of the exit's state by Tracer::check_context_tokens)
      FJ_CHECK(!value->is(ObjRole::kContextToken), "a ContextVar token of the trace outlives its region");
      if (value->role == ObjRole::kNewObject) {  // an object made in the trace, escaping
        py::tuple names(value->keys.size());
        for (size_t i = 0; i < value->keys.size(); ++i) names[i] = value->keys[i];
        std::vector<Rebuild> parts = {Rebuild::constant(value->obj), Rebuild::constant(names),
                                      value->mapping ? rebuild_of(value->mapping)
                                                     : Rebuild::constant(py::none())};
        for (const auto& part : value->items) parts.push_back(rebuild_of(part));
        return memoised(Rebuild::call(PyRefs::get().support.attr("new_object"), std::move(parts)),
                        value);
      }
      if (value->role == ObjRole::kPartial) {  // a functools.partial made in the trace, escaping
        return memoised(Rebuild::call(PyRefs::get().support.attr("make_partial"),
                                      {rebuild_of(value->items[0]), rebuild_of(value->items[1]),
                                       rebuild_of(value->items[2])}),
                        value);
      }
      if (value->remake) {  // a module the trace made: a fresh one, as every call makes
        std::vector<Rebuild> parts = {Rebuild::constant(value->remake)};
        if (value->cause) parts.push_back(rebuild_of(value->cause));  // raise ... from cause
        return memoised(Rebuild::call(PyRefs::get().support.attr("remake"), std::move(parts)),
                        value);
      }
      if (value->role == ObjRole::kGradManager) {  // a fresh, not yet entered manager
        return Rebuild::call(py::reinterpret_borrow<py::object>(
                                 reinterpret_cast<PyObject*>(Py_TYPE(value->obj.ptr()))), {});
      }
      if (value->role == ObjRole::kInferenceManager) {  // made in the trace, not yet entered
        return Rebuild::call(PyRefs::get().torch.attr("inference_mode"),
                             {Rebuild::constant(value->obj.attr("mode"))});
      }
      if (value->role == ObjRole::kAutocastManager) {  // made in the trace, not yet entered
        std::vector<Rebuild> given;
        for (const auto& item : value->items) given.push_back(Rebuild::constant(item->obj));
        return Rebuild::call(PyRefs::get().torch.attr("autocast"), std::move(given));
      }
      FJ_CHECK(value->role != ObjRole::kInferenceExit && value->role != ObjRole::kAutocastExit,
               "a region ends inside an in-graph inference_mode or autocast block");
      if (value->role == ObjRole::kGradSet) {  // made (and switched) in the trace, not yet entered
        return Rebuild::call(PyRefs::get().support.attr("grad_mode_setter"),
                             {Rebuild::constant(value->obj[py::int_(0)]), Rebuild::constant(value->obj[py::int_(1)])});
      }
      if (value->role == ObjRole::kWithExit) {  // the bound __exit__ of a block the region ends inside
        return Rebuild::call(PyRefs::get().support.attr("bound_exit"), {rebuild_of(value->bound_self)});
      }
      if (value->role == ObjRole::kIdentity) {  // id(t) of a tensor input, as it is in this call
        return Rebuild::call(py::module_::import("builtins").attr("id"), {rebuild_of(value->bound_self)});
      }
      if (value->role == ObjRole::kNullExit) {
        return Rebuild::constant(PyRefs::get().support.attr("null_exit"));
      }
      if (value->role == ObjRole::kNullManager) {  // made in the trace, not yet entered
        std::vector<Rebuild> given;
        for (const auto& item : value->items) given.push_back(rebuild_of(item));
        return Rebuild::call(value->obj, std::move(given));
      }
      if (value->role == ObjRole::kGradExit) {  // the __exit__ of a block the region ends inside
        return Rebuild::call(PyRefs::get().support.attr("grad_mode_exit"), {Rebuild::constant(value->obj)});
      }
      if (value->role == ObjRole::kDictView) {  // a real view of the rebuilt (or sourced) dict
        // (an OrderedDict's own view type for one)
        const bool ordered = value->over->is_ordered_dict();
        py::object method = (ordered ? value->over->pytype
                                     : py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(&PyDict_Type)))
                                .attr(value->method.c_str());
        return Rebuild::call(method, {rebuild_of(value->over)});
      }
      if (value->role == ObjRole::kSuper) {  // super() kept across the exit: super(cls, self)
        return Rebuild::call(py::module_::import("builtins").attr("super"),
                             {Rebuild::constant(value->obj), rebuild_of(value->bound_self)});
      }
      if (value->role == ObjRole::kMadeFunction) {  // a function made in the trace, escaping
        std::vector<Rebuild> parts = {Rebuild::constant(value->obj), Rebuild::constant(value->globals)};
        for (const auto& part : value->items) parts.push_back(rebuild_of(part));
        if (value->wrapped) {
          parts.push_back(rebuild_of(value->wrapped));
          parts.push_back(Rebuild::constant(py::bool_(true)));
        }
        for (auto& part : parts) {
          if (part.kind == Rebuild::Kind::kNull) part = Rebuild::constant(py::none());
        }
        return memoised(Rebuild::call(PyRefs::get().support.attr("make_function"), std::move(parts)),
                        value);
      }
      if (value->bound_self) {  // a bound method: types.MethodType(function, self)
        return Rebuild::call(py::module_::import("types").attr("MethodType"),
                             {Rebuild::constant(value->obj), rebuild_of(value->bound_self)});
      }
      if (value->role == ObjRole::kTypeMethod) {
        // LOAD_METHOD's [method, self] pair: CPython holds the function found on the type.
        FJ_CHECK(value->obj && !value->obj.is_none(), "method marker without its function");
      }
      return Rebuild::constant(value->obj);
    case VKind::kCell: {
      // A cell made by MAKE_CELL in this region: a new cell with the content it has now.
      std::vector<Rebuild> content;
      if (!value->items.empty()) content.push_back(rebuild_of(value->items[0]));
      Rebuild cell = memoised(Rebuild::call(py::module_::import("types").attr("CellType"), std::move(content)),
                              value);
      if (ValuePtr function = value->own_function.lock(); function && filled_cells_.insert(value.get()).second) {
        // A recursive nested def's cell: made empty, then (among the exit's writes, built
        // before the frame's state) given the function, whose closure holds this same cell.
        exit_.attr_writes.push_back({cell, py::str("cell_contents"), rebuild_of(function), true});
      }
      return cell;
    }
    case VKind::kSymNum: {
      if (value->size_of) {  // the size of a tensor the exit has: read again from it
        // (a NumPy array's: read off the tensor it is in the graph)
        return Rebuild::call(PyRefs::get().tensor_type.attr("size"),
                             {rebuild_of(Value::plain_tensor(value->size_of)),
                              Rebuild::constant(py::int_(value->size_dim))});
      }
      std::vector<Rebuild> args;
      for (const auto& item : value->items) args.push_back(rebuild_of(item));
      return Rebuild::call(value->fn, std::move(args));
    }
    case VKind::kIter:
      return memoised(iterator_rebuild(value), value);
    case VKind::kTuple:
    case VKind::kList:
    case VKind::kDict:
      if (value->kind == VKind::kDict && value->dict_of) {
        // obj.__dict__ of an object the trace made, left on the stack or in a local: that
        // object's own dict (what runs next may change it: `out.__dict__.pop(key)`), not a copy.
        return memoised(Rebuild::call(PyRefs::get().support.attr("instance_dict"), {rebuild_of(value->dict_of)}),
                        value);
      }
      r.kind = value->kind == VKind::kTuple  ? Rebuild::Kind::kTuple
               : value->kind == VKind::kList ? Rebuild::Kind::kList
                                             : Rebuild::Kind::kDict;
      if (value->kind == VKind::kTuple) r.value = value->pytype;  // (namedtuple, torch.Size)
      r.keys = value->keys;
      for (const auto& item : value->items) r.items.push_back(rebuild_of(item));
      if (value->kind == VKind::kDict && value->factory) {
        // A defaultdict: made by _support.defaultdict_of(factory, items), the factory
        // rebuilt like any value (a function the trace made, a class, a constant).
        return memoised(Rebuild::call(PyRefs::get().support.attr("defaultdict_of"),
                                      {Rebuild::constant(value->pytype), rebuild_of(value->factory), std::move(r)}),
                        value);
      }
      if (value->is_ordered_dict()) {
        return memoised(Rebuild::call(value->pytype, {std::move(r)}), value);  // OrderedDict(items)
      }
      if (value->is_deque()) {  // collections.deque(items, maxlen)
        return memoised(Rebuild::call(value->pytype, {std::move(r), Rebuild::constant(value->deque_maxlen())}),
                        value);
      }
      // Mutable: one object however often it is referenced.
      return value->kind == VKind::kTuple ? r : memoised(std::move(r), value);
    case VKind::kNull:
      r.kind = Rebuild::Kind::kNull;
      return r;
  }
  throw InternalError("unknown value kind at exit");
}

}  // namespace framejit
