// llama-cli's and llama-server's spellings, before CLI11 reads the command line: the ones infer or
// the server supports become their own flags (-cnv is --conversation), the others are refused by
// name. CLI11 reads "-hf" as "-h -f" (help, exit 0) and "-ngl 99" as "-n gl"; a script that passes
// llama-cli's flags must get an error saying so, never a run it did not ask for.
#pragma once

#include <CLI/CLI.hpp>

#include <string>
#include <vector>

#include "runtime/engine/options.h"

namespace moestream {

// argv[1..] with the supported lookalikes renamed; ConfigError naming the first refused flag (and
// what to use instead, where there is something). A single-dash word of several letters that is no
// number and no short option of `app` with its value attached (-n128, -pHello) is refused too. The
// word after an option of `app` that takes a value is its value, passed as it is (-p "-i think").
// `tool`: kToolInfer or kToolServer (-cnv and -sys are infer's only).
std::vector<std::string> translate_llama_flags(const CLI::App& app, int argc, const char* const* argv,
                                               OptionTool tool);

// A command line after translate_llama_flags, for run_tool; a refused flag prints "<tool>: error:
// ..." on stderr and leaves ok() false (the tool exits 1).
class TranslatedArgs {
 public:
  TranslatedArgs(const char* tool_name, const CLI::App& app, int argc, char** argv, OptionTool tool);
  bool ok() const { return ok_; }
  int argc() const { return int(ptrs_.size()); }
  char** argv() { return ptrs_.data(); }

 private:
  std::vector<std::string> words_;
  std::vector<char*> ptrs_;
  bool ok_ = false;
};

}  // namespace moestream
