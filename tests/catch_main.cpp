// Catch2's main for the host tests, compiled once (catch.hpp is costly to compile).
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
