// Ref: the one owning reference to a PyObject. Whether a pointer is new or borrowed is in the
// type: a Ref owns one reference (released when it dies), a plain PyObject* is borrowed. Ref is
// one pointer wide with no pybind11 machinery, so the hot paths (guards, the region loop, exit
// rebuilding) use it as they would a raw pointer, without hand-counting on error paths.
#pragma once

#include <Python.h>

#include <cstddef>
#include <memory>
#include <new>
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

// n Refs with inline room for N (no allocation up to N), made and released n at a time: the
// per-call owning arrays of the hot paths (guard slots, graph registers), which must not pay
// for all N entries on every call.
template <size_t N>
class RefBuffer {
 public:
  RefBuffer() = default;
  RefBuffer(const RefBuffer&) = delete;
  RefBuffer& operator=(const RefBuffer&) = delete;
  ~RefBuffer() { clear(); }

  // n empty Refs (the ones held before are released).
  void reset(size_t n) {
    clear();
    if (n > N) {
      heap_ = std::make_unique<Ref[]>(n);
      data_ = heap_.get();
    } else {
      data_ = reinterpret_cast<Ref*>(inline_);
      for (size_t i = 0; i < n; ++i) new (&data_[i]) Ref();
    }
    size_ = n;
  }
  void clear() {
    if (heap_) {
      heap_.reset();
    } else {
      for (size_t i = 0; i < size_; ++i) data_[i].~Ref();
    }
    data_ = nullptr;
    size_ = 0;
  }
  Ref& operator[](size_t i) { return data_[i]; }
  const Ref& operator[](size_t i) const { return data_[i]; }
  size_t size() const { return size_; }
  Ref* data() { return data_; }
  // As an array of borrowed pointers (Ref is one pointer wide).
  PyObject* const* borrowed() const { return reinterpret_cast<PyObject* const*>(data_); }

 private:
  alignas(Ref) unsigned char inline_[N * sizeof(Ref)];
  std::unique_ptr<Ref[]> heap_;
  Ref* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace framejit
