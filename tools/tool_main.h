// The tail every tool's main() shares: parse the command line (--help exits 0, a bad flag 1), run,
// and turn an exception into one line on stderr, "<tool>: error: ...", and exit status 1.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>

#include "common/error.h"

namespace moestream {

// stdout is flushed before the message so that text already generated comes out first.
template <typename Run>
int run_tool(const char* name, CLI::App& app, int argc, char** argv, Run&& run) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 1;
  }
  try {
    return run();
  } catch (const Error& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "%s: error: %s\n", name, e.what());
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "%s: unexpected error: %s\n", name, e.what());
  }
  return 1;
}

}  // namespace moestream
