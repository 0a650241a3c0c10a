// The tail every tool's main() shares: parse the command line (--help exits 0, a bad flag 1), run,
// and turn an exception into one line on stderr, "<tool>: error: ...", and exit status 1.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <string>
#include <string_view>

#include "common/error.h"
#include "common/option_ref.h"

namespace moestream {

// stdout is flushed before the message so that text already generated comes out first. Option
// marks in a message (common/option_ref.h) are spelled by `render` (infer and the server: the
// option table's flags), else by the plain flag rule.
template <typename Run, typename Render = std::string (*)(std::string_view)>
int run_tool(const char* name, CLI::App& app, int argc, char** argv, Run&& run,
             Render render = &render_option_refs_as_flags) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 1;
  }
  try {
    return run();
  } catch (const Error& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "%s: error: %s\n", name, render(e.what()).c_str());
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "%s: unexpected error: %s\n", name, render(e.what()).c_str());
  }
  return 1;
}

}  // namespace moestream
