// Error types and check macros: internal faults vs. constructs a user wrote that cannot be traced.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace framejit {

// A framejit bug: the region is marked failed, one warning is emitted, CPython runs the frame.
class InternalError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Stable categories of "this cannot be traced (yet)"; the category names appear in logs.
enum class BreakKind {
  kUnsupportedOpcode,
  kUnsupportedCall,
  kDataDependent,  // the program needs a tensor's value (branch, .item(), ...)
  kSideEffect,     // a write to a pre-existing Python object
  kMetaFailure,    // a torch call failed on meta tensors
  kUnsupportedValue,
  kTraceTooLong,
};

const char* break_kind_name(BreakKind kind);

// Something in the user's program that the tracer does not handle. Carries the bytecode offset
// (in code units) of the instruction that stopped tracing, so callers can name file:line.
class Unsupported : public std::runtime_error {
 public:
  Unsupported(BreakKind kind, std::string message, std::string hint = {})
      : std::runtime_error(message), kind_(kind), hint_(std::move(hint)) {}
  BreakKind kind() const { return kind_; }
  const std::string& hint() const { return hint_; }
  int pc = -1;  // filled in by the tracer loop
  // The traced program itself raised here (a subscript of None, a raise with no handler), as
  // opposed to a construct framejit does not trace (FJ_PROGRAM_RAISED).
  bool program_raised = false;
  // A construct only torch.compile's own tracer handles (a higher-order op such as
  // associative_scan, which a library calls on its compile-only path).
  bool compile_path_only = false;

 private:
  BreakKind kind_;
  std::string hint_;
};

}  // namespace framejit

#define FJ_CHECK(cond, ...)                                                                  \
  do {                                                                                       \
    if (!(cond)) {                                                                           \
      throw ::framejit::InternalError(fmt::format("{}:{}: check '{}' failed: ", __FILE__,   \
                                                  __LINE__, #cond) +                         \
                                      fmt::format(__VA_ARGS__));                             \
    }                                                                                        \
  } while (0)

#define FJ_UNSUPPORTED(kind, ...) \
  throw ::framejit::Unsupported(::framejit::BreakKind::kind, fmt::format(__VA_ARGS__))

#define FJ_PROGRAM_RAISED(kind, ...)                                                          \
  do {                                                                                        \
    ::framejit::Unsupported raised_(::framejit::BreakKind::kind, fmt::format(__VA_ARGS__));  \
    raised_.program_raised = true;                                                            \
    throw raised_;                                                                            \
  } while (0)
