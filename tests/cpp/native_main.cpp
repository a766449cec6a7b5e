// Catch2 runner for the native backend's tests: plain libtorch, no Python interpreter.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
