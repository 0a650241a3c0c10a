// Every user option of the engine and its front ends, declared once: name, flag, type, range,
// group, the tools it applies to, its environment variable and help (options_table.cpp), and the
// cross-option rules as data. infer's and the server's flags (tools/option_cli.h), Python's
// keywords (python/src/model_bindings.cpp), the checks and docs/options.md are made from it.
// Defaults are not in the table: each is the initial value of the field the option sets
// (EngineSettings' members for engine options, the tool's own struct for the rest).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "loader/store/store_options.h"
#include "runtime/engine/model.h"
#include "runtime/model/sampler.h"

namespace moestream {

enum class OptionType { kFlag, kInt, kUint32, kUint64, kFloat, kText, kList };

// The sections of the help text and docs/options.md, in this order.
enum class OptionGroup { kModel, kChat, kSampling, kIoStore, kGpu, kRouting, kBenchmarking, kServer };
std::string_view option_group_title(OptionGroup g);

// Where an option applies (a bit set).
enum OptionTool : unsigned {
  kToolInfer = 1,
  kToolServer = 2,
  kToolPythonModel = 4,     // moestream.Model(...) keyword
  kToolPythonGenerate = 8,  // Model.generate(...) keyword (the server takes these per request)
};

// Who reads a message, hence how its option marks (common/option_ref.h) are spelled.
enum class OptionCaller { kCli, kPython, kServerRequest };

// The engine options' values, with their defaults as initial values: what a front end fills and
// hands to the engine (model_options(), store, sampling).
struct EngineSettings {
  ModelOptions model;   // threads, ctx, checksums, cache-aware routing, look-ahead, GPU
  StoreConfig store;    // expert reads
  SamplerParams sampling;
  int batch = 0;        // tokens per forward chunk; 0 = default_max_batch(model.gpu)
  std::string collect_routing, replay_routing;
  bool collect_router_inputs = false;
  // model with max_batch resolved from batch and the store's checksum choice.
  ModelOptions model_options() const;
};

using OptionTarget =
    std::variant<bool*, int*, uint32_t*, uint64_t*, float*, std::string*, std::vector<std::string>*>;

struct OptionSpec {
  std::string_view name;  // canonical snake_case: the Python keyword and the marks' name
  // Extra CLI names, comma-separated and without their dashes (cli_flag adds them): one letter
  // for a short name, or a long one that replaces the name with dashes ("temp" for temperature;
  // a negated option's derives from "no-" + the name, beside any alias).
  std::string_view cli;
  OptionType type;
  long double lo, hi;     // inclusive range of a number; lo == hi: unchecked here (its consumer checks)
  OptionGroup group;
  unsigned tools;         // OptionTool bits
  bool env;               // read from MOESTREAM_<NAME> when not given (never for a negated flag)
  bool negated;           // the flag sets false (verify_checksums is false when given)
  OptionTarget (*engine)(EngineSettings&);  // its field in EngineSettings; null: the tool's own
  std::string_view help;
};

// Cross-option rules: `option` in effect (a flag on, a value other than its default) needs
// `other` in effect (kRequires) or must not meet it (kExcludes), for the tools in `tools`.
enum class RuleKind { kRequires, kExcludes };
struct OptionRule {
  RuleKind kind;
  std::string_view option, other;
  unsigned tools;
  std::string_view why;  // appended after ": " when not empty
};

std::span<const OptionSpec> option_table();
std::span<const OptionRule> option_rules();
const OptionSpec* find_option(std::string_view name);  // null when absent
const OptionSpec& option(std::string_view name);       // asserts it exists
std::string option_env_name(const OptionSpec& s);      // "MOESTREAM_IO_QD"
std::string option_flag(const OptionSpec& s);          // io_qd's flag: the spelling in messages
std::string option_cli_names(const OptionSpec& s);     // CLI11's names, comma-separated

// `text` with its option marks in `caller`'s spelling: a flag (gpu's, moe_lookahead's with its
// value, auto_direct=false's negated one), a keyword ("gpu=True", "moe_lookahead=4"), or for
// a server request a JSON field (options that are no server flag) or the server's flag. A mark
// the table does not hold names another tool's flag, spelled as a flag for every caller.
std::string render_options(std::string_view text, OptionCaller caller);

// An option's current and default value, for the rules.
struct OptionValue {
  const OptionSpec* spec;
  bool in_effect;  // differs from the default
};
// Throws ConfigError (with marks) for the first rule of `tool` the values break; a rule naming an
// option absent from `values` is not checked.
void check_option_rules(std::span<const OptionValue> values, unsigned tool);

// The text of a value (the default column of the help text and the docs, and "in effect").
std::string option_value_text(const OptionTarget& t);
// Sets `t` from text (an environment variable's value, `source` naming it): a number in decimal
// within the option's range, true/false/1/0 for a flag; ConfigError with a mark otherwise.
void set_option_text(const OptionSpec& s, const OptionTarget& t, std::string_view text, std::string_view source);

// Throws ConfigError (with marks) for engine options that cannot work: the rules among
// ModelOptions' own fields, a negative look-ahead, gpu without a usable device. Model::load calls
// it; front ends call it first so the error comes before their slow work.
void check_model_options(const ModelOptions& opts);

}  // namespace moestream
