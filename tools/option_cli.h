// infer's and moestream-server's flags, made from the option table (runtime/engine/options.h):
// each option of the tool with its names, type, range check, default, environment variable and
// help, in --help sections by group; the cross-option rules after parsing; the Markdown of
// docs/options.md.
#pragma once

#include <CLI/CLI.hpp>

#include <string>
#include <string_view>
#include <vector>

#include "runtime/engine/options.h"

namespace moestream {

class OptionCli {
 public:
  explicit OptionCli(OptionTool tool) : tool_(tool) {}
  // Where a table option that is not an engine option keeps its value for this tool (its
  // initial value is the default). Call before add_to.
  template <class T>
  void bind(std::string_view name, T& value) {
    locals_.push_back({&option(name), OptionTarget(&value), {}});
  }
  // Adds every option of the tool, in table order: engine options set `engine`'s fields, the
  // others the bound values; asserts that each has one. Also adds --help-markdown.
  void add_to(CLI::App& app, EngineSettings& engine);
  // After parsing: the rules of the table (ConfigError with option marks, run_tool spells them).
  void check_rules() const;
  // True when --help-markdown was given: the caller prints markdown() and exits.
  bool markdown_asked() const { return markdown_; }
  // This tool's options as Markdown sections (docs/options.md is made of infer's and the server's).
  std::string markdown() const;

 private:
  struct Bound {
    const OptionSpec* spec;
    OptionTarget target;
    std::string default_text;
  };
  OptionTool tool_;
  std::vector<Bound> locals_, bound_;
  bool markdown_ = false;
};

}  // namespace moestream
