// Catch2 runner that owns an embedded Python interpreter for the whole test session.
#define CATCH_CONFIG_RUNNER
#include <pybind11/embed.h>

#include <catch2/catch.hpp>

int main(int argc, char* argv[]) {
  pybind11::scoped_interpreter interpreter{};
  return Catch::Session().run(argc, argv);
}
