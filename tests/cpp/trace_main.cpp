// Catch2 runner for the trace components: an embedded interpreter with torch and framejit's
// Python half imported, and the trace layer's Python references initialised from it, as
// framejit._C's module init does.
#define CATCH_CONFIG_RUNNER
#include <pybind11/embed.h>

#include <catch2/catch.hpp>

#include "trace/pyrefs.h"

int main(int argc, char* argv[]) {
  pybind11::scoped_interpreter interpreter{};
  pybind11::module_::import("torch");
  framejit::PyRefs::init(pybind11::module_::import("framejit._support"));
  return Catch::Session().run(argc, argv);
}
