// The kinds in which framejit._support answers the tracer's questions, each defined once here as
// an X-macro list and exposed to Python as an enum of framejit._C (module.cpp), so that the
// Python half returns the same enum the C++ half switches on, and no string decides a kind.
#pragma once

#include <cstdint>

namespace framejit {

// What a callable is to the tracer (_support.classify_callable).
#define FJ_FOREACH_CALLABLE_KIND(V)                                                          \
  V(kNotTraced, NOT_TRACED)               /* nothing the tracer models: inlined if Python */ \
  V(kTorchOp, TORCH_OP)                   /* a torch function: one graph node */             \
  V(kQuery, QUERY)                        /* a metadata question: a constant of the trace */ \
  V(kBuiltin, BUILTIN)                    /* a pure builtin / math / operator function */    \
  V(kGradModeManager, GRAD_MODE_MANAGER)  /* torch.no_grad, torch.enable_grad */             \
  V(kSetGradEnabled, SET_GRAD_ENABLED)    /* torch.set_grad_enabled */                       \
  V(kInferenceMode, INFERENCE_MODE)       /* torch.inference_mode */                         \
  V(kAutocast, AUTOCAST)                  /* torch.autocast */                               \
  V(kNullContext, NULL_CONTEXT)           /* record_function, nullcontext: nothing to hold */ \
  V(kGradModeClone, GRAD_MODE_CLONE)      /* ctx_factory of a @torch.no_grad() wrapper */    \
  V(kGradModeWrapper, GRAD_MODE_WRAPPER)  /* that wrapper */                                 \
  V(kModuleListing, MODULE_LISTING)       /* Module.modules(), parameters(), ... */          \
  V(kAttributeBuiltin, ATTRIBUTE_BUILTIN) /* getattr, hasattr, setattr, delattr, vars */     \
  V(kNextBuiltin, NEXT_BUILTIN)           /* next */                                         \
  V(kCompilingFlag, COMPILING_FLAG)       /* torch.compiler.is_compiling & co: True here */ \
  V(kExportingFlag, EXPORTING_FLAG)       /* torch.compiler.is_exporting: False here */ \
  V(kInGraph, IN_GRAPH)                   /* allow_in_graph(fn): one graph node, not traced */

// How obj.name resolves without running user code (_support.resolve_attribute and friends).
#define FJ_FOREACH_ATTR_KIND(V)                                                           \
  V(kMissing, MISSING)               /* absent, or a descriptor that would run code */    \
  V(kInstance, INSTANCE)             /* instance state; value: the dict that holds it */  \
  V(kClassValue, CLASS_VALUE)        /* a plain class attribute */                        \
  V(kFunction, FUNCTION)             /* a function on the class, bound to the instance */ \
  V(kPlainFunction, PLAIN_FUNCTION)  /* a function read off a class itself */             \
  V(kStaticMethod, STATICMETHOD)     /* value: the function */                            \
  V(kClassMethod, CLASSMETHOD)       /* value: the function */                            \
  V(kProperty, PROPERTY)             /* value: its getter */                              \
  V(kObjectGetattribute, OBJECT_GETATTRIBUTE) /* object.__getattribute__ (super() of it) */ \
  V(kBuiltinMethod, BUILTIN_METHOD)  /* dict.get, object.__setattr__ past Python classes; */ \
                                     /* value: the descriptor */

// Whether hasattr(obj, name) holds, decided without running user code
// (_support.attribute_presence).
#define FJ_FOREACH_PRESENCE(V) \
  V(kPresent, PRESENT)         \
  V(kAbsent, ABSENT)           \
  V(kUnknown, UNKNOWN) /* a property, slot or __getattr__ could decide it */

// What a Tensor method is to the tracer (_support.tensor_method_kind).
#define FJ_FOREACH_TENSOR_METHOD_KIND(V)                                       \
  V(kNotTraceable, NOT_TRACEABLE) /* needs the data, or not a Tensor method */ \
  V(kOp, OP)                      /* a graph node */                           \
  V(kMetadata, METADATA)          /* reads metadata: a constant of the trace */

#define FJ_ENUM_ENTRY(name, py_name) name,
enum class CallableKind : uint8_t { FJ_FOREACH_CALLABLE_KIND(FJ_ENUM_ENTRY) };
enum class AttrKind : uint8_t { FJ_FOREACH_ATTR_KIND(FJ_ENUM_ENTRY) };
enum class Presence : uint8_t { FJ_FOREACH_PRESENCE(FJ_ENUM_ENTRY) };
enum class TensorMethodKind : uint8_t { FJ_FOREACH_TENSOR_METHOD_KIND(FJ_ENUM_ENTRY) };
#undef FJ_ENUM_ENTRY

// A function-like class attribute: bound as Python binds it.
inline bool is_function_like(AttrKind kind) {
  return kind == AttrKind::kFunction || kind == AttrKind::kProperty ||
         kind == AttrKind::kClassMethod || kind == AttrKind::kStaticMethod ||
         kind == AttrKind::kPlainFunction;
}

}  // namespace framejit
