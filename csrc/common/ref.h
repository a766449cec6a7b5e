// Ref: the one owning reference to a PyObject. Whether a pointer is new or borrowed is in the
// type: a Ref owns one reference (released when it dies), a plain PyObject* is borrowed. Ref is
// one pointer wide with no pybind11 machinery, so the hot paths (guards, the region loop, exit
// rebuilding) use it as they would a raw pointer, without hand-counting on error paths.
#pragma once

#include <Python.h>

#include <utility>

namespace framejit {

class Ref {
 public:
  Ref() = default;
  // Takes over a new reference (NULL allowed).
  static Ref steal(PyObject* obj) { return Ref(obj); }
  // Adds a reference to a borrowed object (NULL allowed).
  static Ref borrow(PyObject* obj) {
    Py_XINCREF(obj);
    return Ref(obj);
  }
  Ref(Ref&& other) noexcept : obj_(other.obj_) { other.obj_ = nullptr; }
  Ref& operator=(Ref&& other) noexcept {
    if (this != &other) reset(other.release());
    return *this;
  }
  Ref(const Ref&) = delete;
  Ref& operator=(const Ref&) = delete;
  ~Ref() { Py_XDECREF(obj_); }

  PyObject* get() const { return obj_; }  // Borrowed
  explicit operator bool() const { return obj_ != nullptr; }
  // New: the caller owns the reference from here on.
  PyObject* release() {
    PyObject* out = obj_;
    obj_ = nullptr;
    return out;
  }
  // Drops the reference held (if any) and takes over `stolen`.
  void reset(PyObject* stolen = nullptr) {
    PyObject* old = obj_;
    obj_ = stolen;
    Py_XDECREF(old);
  }

 private:
  explicit Ref(PyObject* obj) : obj_(obj) {}
  PyObject* obj_ = nullptr;
};

// Arrays of Refs are read as arrays of borrowed pointers (SlotValues::data()).
static_assert(sizeof(Ref) == sizeof(PyObject*), "Ref is one pointer wide");

}  // namespace framejit
