// Standard-library objects the tracer answers itself instead of tracing their Python (the trace
// policy leaves the standard library untraced): logging's level checks, so that a disabled
// `logger.debug(...)` is nothing in the trace and `logger.isEnabledFor(level)` a constant, each
// guarded by what the answer read; and contextvars.ContextVar's get / set / reset, the value read
// by source and a set replayed at the region's exit.
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/check.h"
#include "trace/pyrefs.h"
#include "trace/tracer.h"

namespace framejit {

namespace {

// logging's objects, looked up once (never released: interpreter teardown order).
PyObject* kept(py::object obj) { return obj.release().ptr(); }

struct LoggingRefs {
  PyObject* logger_type = nullptr;       // logging.Logger
  PyObject* root_logger_type = nullptr;  // logging.RootLogger
  PyObject* get_logger = nullptr;        // logging.getLogger
  PyObject* is_enabled_for = nullptr;    // Logger.isEnabledFor
  PyObject* log = nullptr;               // Logger.log(level, msg, ...)
  // Logger.debug, info, warning, error, exception, critical (and fatal, the same function) with
  // the level each logs at. (Logger.warn is left out: it warns that it is deprecated first.)
  std::vector<std::pair<PyObject*, int>> at_level;

  static const LoggingRefs& get() {
    static const LoggingRefs refs = [] {
      LoggingRefs r;
      py::module_ logging = py::module_::import("logging");
      py::object logger = logging.attr("Logger");
      r.logger_type = kept(logger);
      r.root_logger_type = kept(logging.attr("RootLogger"));
      r.get_logger = kept(logging.attr("getLogger"));
      py::handle cls(r.logger_type);
      r.is_enabled_for = kept(cls.attr("isEnabledFor"));
      r.log = kept(cls.attr("log"));
      const std::pair<const char*, const char*> methods[] = {
          {"debug", "DEBUG"}, {"info", "INFO"},         {"warning", "WARNING"}, {"error", "ERROR"},
          {"exception", "ERROR"}, {"critical", "CRITICAL"}, {"fatal", "CRITICAL"}};
      for (const auto& [name, level] : methods) {
        r.at_level.emplace_back(kept(cls.attr(name)), logging.attr(level).cast<int>());
      }
      return r;
    }();
    return refs;
  }

  // The level a Logger method logs at (-1: at its `level` argument, Logger.log); -2 if `fn` is
  // none of them.
  int level_of(PyObject* fn) const {
    if (fn == log) return -1;
    for (const auto& [method, level] : at_level) {
      if (method == fn) return level;
    }
    return -2;
  }
};

// ContextVar's methods (method descriptors of the C type).
struct ContextRefs {
  PyObject* get = nullptr;
  PyObject* set = nullptr;
  PyObject* reset = nullptr;

  static const ContextRefs& get_refs() {
    static const ContextRefs refs = [] {
      ContextRefs r;
      py::handle cls(reinterpret_cast<PyObject*>(&PyContextVar_Type));
      r.get = kept(cls.attr("get"));
      r.set = kept(cls.attr("set"));
      r.reset = kept(cls.attr("reset"));
      return r;
    }();
    return refs;
  }
  const char* name_of(PyObject* fn) const {
    return fn == get ? "get" : fn == set ? "set" : fn == reset ? "reset" : nullptr;
  }
  PyObject* by_name(const std::string& name) const {
    return name == "get" ? get : name == "set" ? set : name == "reset" ? reset : nullptr;
  }
};

}  // namespace

std::optional<bool> Tracer::logger_enabled(const ValuePtr& logger, const ValuePtr& level_in) {
  const LoggingRefs& refs = LoggingRefs::get();
  // A logger read by source (its type guarded when it was read) of logging's own classes, whose
  // isEnabledFor is the one this answers for.
  if (logger->kind != VKind::kObject || !logger->is(ObjRole::kPlain) || logger->bound_self ||
      logger->source < 0) {
    return std::nullopt;
  }
  PyObject* type = reinterpret_cast<PyObject*>(Py_TYPE(logger->obj.ptr()));
  if (type != refs.logger_type && type != refs.root_logger_type) return std::nullopt;
  const ValuePtr level = sizes_.concretize(level_in);
  if (!level->is_const() || !PyLong_CheckExact(level->obj.ptr())) return std::nullopt;
  // Asked now, as the call would: it fills the logger's cache for this level unless disabled.
  const bool enabled = logger->obj.attr("isEnabledFor")(level->obj).cast<bool>();
  // What that answer read: `disabled`, then the cached answer. Logger.setLevel and
  // logging.disable() clear every logger's cache, so the guard on the cache sees them.
  ValuePtr disabled = entry_.load(entry_.sources().attr(logger->source, "disabled"));
  if (!disabled || !disabled->is_const()) return std::nullopt;  // (guarded by value)
  if (PyObject_IsTrue(disabled->obj.ptr()) == 1) return false;
  ValuePtr cache = entry_.load(entry_.sources().attr(logger->source, "_cache"));
  if (!cache || cache->source < 0 || !PyDict_CheckExact(cache->obj.ptr()) ||
      PyDict_Contains(cache->obj.ptr(), level->obj.ptr()) != 1) {
    return std::nullopt;
  }
  entry_.guard_dict_contains(cache->source, level->obj.ptr(), true);
  ValuePtr cached = entry_.load(entry_.sources().item(cache->source, level->obj));
  if (!cached || !cached->is_const()) return std::nullopt;  // (guarded by value)
  FJ_CHECK(PyObject_IsTrue(cached->obj.ptr()) == (enabled ? 1 : 0),
           "logger cache disagrees with isEnabledFor");
  return enabled;
}

ValuePtr Tracer::stdlib_call(const ValuePtr& fn, const std::vector<ValuePtr>& args, const KwValues& kwargs) {
  const LoggingRefs& refs = LoggingRefs::get();
  PyObject* callable = fn->obj.ptr();
  if (callable == refs.get_logger && !fn->bound_self) return logger_lookup(args, kwargs);
  const char* context_method = ContextRefs::get_refs().name_of(callable);
  // A Logger method's level (-1: given as its argument), -2 for any other function.
  const int fixed = callable == refs.is_enabled_for ? -1 : refs.level_of(callable);
  if (context_method == nullptr && fixed == -2) return nullptr;
  const auto [self, self_at] = method_receiver(fn, args);
  if (!self) return nullptr;
  if (context_method != nullptr) {
    return context_var_call(context_method, self, {args.begin() + static_cast<long>(self_at), args.end()}, kwargs);
  }
  const bool takes_level = fixed == -1;  // isEnabledFor(level), log(level, msg, ...)
  if (callable == refs.is_enabled_for && (args.size() != self_at + 1 || !kwargs.empty())) return nullptr;
  if (takes_level && args.size() < self_at + 1) return nullptr;
  const ValuePtr level = takes_level ? args[self_at] : Value::constant(py::int_(fixed));
  const std::optional<bool> enabled = logger_enabled(self, level);
  if (!enabled) return nullptr;
  if (callable == refs.is_enabled_for) return Value::constant(py::bool_(*enabled));
  // A record that would be logged is Python's to log: the region ends at the call.
  if (*enabled) return nullptr;
  return Value::constant(py::none());  // disabled: the call does nothing (its message unformatted)
}

ValuePtr Tracer::logger_lookup(const std::vector<ValuePtr>& args, const KwValues& kwargs) {
  // logging.getLogger(name) with a name known at trace time, of a logger that exists: the one
  // logging.Logger.manager.loggerDict holds (read there, its presence and type guarded), as
  // getLogger returns it. The root logger for no name.
  if (!kwargs.empty() || args.size() > 1) return nullptr;
  const ValuePtr name = args.empty() ? Value::constant(py::none()) : sizes_.concretize(args[0]);
  if (!name->is_const()) return nullptr;
  const SourceTable& sources = entry_.sources();
  ValuePtr logging = entry_.load(SourceTable::imported_module("logging"));
  if (!logging) return nullptr;
  ValuePtr root = entry_.load(sources.attr(logging->source, "root"));
  if (!root) return nullptr;
  PyObject* key = name->obj.ptr();
  if (key == Py_None || (PyUnicode_CheckExact(key) && PyUnicode_GetLength(key) == 0)) return root;
  if (!PyUnicode_CheckExact(key)) return nullptr;
  ValuePtr root_name = entry_.load(sources.attr(root->source, "name"));  // (guarded by value)
  if (!root_name || !root_name->is_const()) return nullptr;
  if (root_name->obj.equal(name->obj)) return root;
  ValuePtr cls = entry_.load(sources.attr(logging->source, "Logger"));
  ValuePtr manager = cls ? entry_.load(sources.attr(cls->source, "manager")) : nullptr;
  ValuePtr loggers = manager ? entry_.load(sources.attr(manager->source, "loggerDict")) : nullptr;
  if (!loggers || loggers->source < 0 || !PyDict_CheckExact(loggers->obj.ptr()) ||
      PyDict_Contains(loggers->obj.ptr(), key) != 1) {
    return nullptr;  // (a logger getLogger would make: Python's to make)
  }
  PyObject* found = PyDict_GetItem(loggers->obj.ptr(), key);  // Borrowed
  if (found == nullptr || !PyObject_TypeCheck(found, reinterpret_cast<PyTypeObject*>(LoggingRefs::get().logger_type))) {
    return nullptr;  // a placeholder for a logger's children: getLogger makes the logger
  }
  entry_.guard_dict_contains(loggers->source, key, true);
  return entry_.load(sources.item(loggers->source, name->obj));  // (its type guarded)
}

ValuePtr Tracer::context_var_method(const ValuePtr& base, const std::string& name) {
  if (base->kind != VKind::kObject || !base->is(ObjRole::kPlain) || base->bound_self ||
      base->source < 0 || !PyContextVar_CheckExact(base->obj.ptr())) {
    return nullptr;  // (read by source: its type is guarded)
  }
  PyObject* descriptor = ContextRefs::get_refs().by_name(name);
  if (descriptor == nullptr) return nullptr;
  ValuePtr method = Value::object(py::reinterpret_borrow<py::object>(descriptor));
  method->bound_self = base;
  return method;
}

ValuePtr Tracer::context_var_call(const std::string& name, const ValuePtr& var, const std::vector<ValuePtr>& args,
                                  const KwValues& kwargs) {
  if (var->kind != VKind::kObject || !var->is(ObjRole::kPlain) || var->bound_self || var->source < 0 ||
      !PyContextVar_CheckExact(var->obj.ptr()) || !kwargs.empty()) {
    return nullptr;
  }
  ContextVarState* state = nullptr;
  for (ContextVarState& known : context_vars_) {
    if (known.var->obj.ptr() == var->obj.ptr()) state = &known;
  }
  if (name == "get" && args.size() <= 1) {
    if (state != nullptr && state->current) return state->current;
    // As it is in the running context: read by source on every call.
    if (args.size() == 1) {  // get(default): the default where the context has no value
      static PyObject* const kUnset =  // (never released: interpreter teardown order)
          py::object(PyRefs::get().support.attr("CONTEXT_VAR_UNSET")).release().ptr();
      ValuePtr value = entry_.load(entry_.sources().context_value(
          var->source, py::reinterpret_borrow<py::object>(kUnset)));
      FJ_CHECK(value != nullptr && value->source >= 0, "ContextVar.get(<unset>) unreadable");
      if (value->obj.ptr() != kUnset) return value;  // (its guard fails on <unset>)
      entry_.guard_id(value->source, kUnset);
      return args[0];
    }
    ValuePtr value = entry_.load(entry_.sources().context_value(var->source));
    if (!value) {
      // Neither a value nor a default: get() raises LookupError (Python's to raise).
      FJ_UNSUPPORTED(kUnsupportedValue, "{}.get() of a variable with no value", var->describe());
    }
    return value;
  }
  if (name == "set" && args.size() == 1) {
    const CallSite site = call_site_here();
    if (!may_inline(site)) {
      FJ_UNSUPPORTED(kUnsupportedCall, "ContextVar.set(), whose token outlives the region ({})",
                     no_inline_->at(site));
    }
    if (state == nullptr) {
      context_vars_.push_back({var, nullptr});
      state = &context_vars_.back();
    }
    ValuePtr token = Value::object(var->obj);
    token->role = ObjRole::kContextToken;
    token->over = state->current;
    state->current = args[0];
    context_tokens_.push_back({token, site, false});
    return token;
  }
  if (name == "reset" && args.size() == 1) {
    const ValuePtr& token = args[0];
    ContextToken* made = nullptr;
    for (ContextToken& known : context_tokens_) {
      if (known.token == token) made = &known;
    }
    // A token made before the region (or one of another variable, or used twice: Python raises).
    if (made == nullptr || made->used || state == nullptr || token->obj.ptr() != var->obj.ptr()) {
      FJ_UNSUPPORTED(kUnsupportedCall, "{}.reset() with {}", var->describe(), token->describe());
    }
    made->used = true;
    state->current = token->over;
    return Value::constant(py::none());
  }
  return nullptr;
}

void Tracer::check_context_tokens(const std::vector<ValuePtr>& values) {
  if (context_tokens_.empty()) return;
  auto check = [&](const ValuePtr& value) {
    Value* token = context_token_in(value);
    if (token == nullptr) return;
    for (const ContextToken& made : context_tokens_) {
      if (made.token.get() == token) {
        // Only Python can make the real token: traced again with that set left to it.
        const std::string& why = exits_.exit().reason;
        throw InlineBreak{made.made_at, why.empty() ? "kept past the region's return" : "kept where the region ends: " + why};
      }
    }
  };
  for (const ValuePtr& value : values) check(value);
  for (const PendingWrite& write : effects_.writes()) check(write.value);  // self._token = var.set(v)
  for (const ValuePtr& container : effects_.adopted()) check(container);  // tokens.append(var.set(v))
}

void Tracer::add_context_writes() {
  // After the region's other writes: var.set(value), as the last set (or reset) left it.
  static PyObject* const kSet = PyUnicode_InternFromString("set");
  for (const ContextVarState& state : context_vars_) {
    if (!state.current) continue;  // reset to its entry value: nothing to do
    exits_.exit().attr_writes.push_back({exits_.rebuild_of(state.var), py::reinterpret_borrow<py::object>(kSet),
                                         exits_.rebuild_of(state.current), false, false, Rebuild(), true});
  }
}

}  // namespace framejit
