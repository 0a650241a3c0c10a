// Implementation of tools/option_cli.h.
#include "tools/option_cli.h"

#include <cstdint>
#include <type_traits>

#include "common/error.h"
#include "tools/cli_range.h"

namespace moestream {

namespace {

std::string type_text(const OptionSpec& s) {
  switch (s.type) {
    case OptionType::kFlag: return "flag";
    case OptionType::kInt: return "int";
    case OptionType::kUint32:
    case OptionType::kUint64: return "uint";
    case OptionType::kFloat: return "float";
    case OptionType::kText: return "text";
    case OptionType::kList: return "text, repeatable";
  }
  return "";
}

template <class T>
CLI::Option* add_value(CLI::App& app, const std::string& names, T& v, const OptionSpec& s, const std::string& help) {
  CLI::Option* o = app.add_option(names, v, help);
  if constexpr (!std::is_same_v<T, std::vector<std::string>>) {
    if constexpr (std::is_same_v<T, std::string>) {
      if (!v.empty()) o->capture_default_str();
    } else {
      o->capture_default_str();
    }
    if constexpr (std::is_arithmetic_v<T>)
      if (s.lo != s.hi) o->check(in_range(static_cast<T>(s.lo), static_cast<T>(s.hi)));
  }
  return o;
}

std::string escape_cell(std::string t) {
  std::string out;
  for (char c : t) out += c == '|' ? std::string("\\|") : std::string(1, c);
  return out;
}

}  // namespace

void OptionCli::add_to(CLI::App& app, EngineSettings& engine) {
  for (const OptionSpec& s : option_table()) {
    if (!(s.tools & tool_)) continue;
    OptionTarget target;
    if (s.engine != nullptr) {
      target = s.engine(engine);
    } else {
      const Bound* local = nullptr;
      for (const Bound& b : locals_)
        if (b.spec == &s) local = &b;
      MOE_ASSERT(local != nullptr, "a table option of this tool has no bound value");
      target = local->target;
    }
    bound_.push_back({&s, target, option_value_text(target)});
    const std::string names = option_cli_names(s);
    const std::string help = render_options(s.help, OptionCaller::kCli);
    CLI::Option* o = std::visit([&](auto* p) -> CLI::Option* {
      using T = std::remove_pointer_t<decltype(p)>;
      if constexpr (std::is_same_v<T, bool>) {
        MOE_ASSERT(s.type == OptionType::kFlag, "a bool target for a valued option");
        if (s.negated) return app.add_flag_callback(names, [p] { *p = false; }, help);
        return app.add_flag(names, *p, help);
      } else {
        MOE_ASSERT(s.type != OptionType::kFlag, "a flag bound to a value");
        return add_value(app, names, *p, s, help);
      }
    }, target);
    if (s.env) o->envname(option_env_name(s));
    o->group(std::string(option_group_title(s.group)));
  }
  app.add_flag("--help-markdown", markdown_, "print this tool's options as Markdown (docs/options.md) and exit");
}

void OptionCli::check_rules() const {
  std::vector<OptionValue> values;
  for (const Bound& b : bound_) values.push_back({b.spec, option_value_text(b.target) != b.default_text});
  check_option_rules(values, tool_);
}

std::string OptionCli::markdown() const {
  std::string out;
  bool first = true;
  OptionGroup group{};
  for (const Bound& b : bound_) {
    const OptionSpec& s = *b.spec;
    if (first || s.group != group) {
      out += std::string(first ? "" : "\n") + "### " + std::string(option_group_title(s.group)) + "\n\n";
      out += "| Flag | Python | Tools | Type, range | Default | Environment | Description |\n";
      out += "| --- | --- | --- | --- | --- | --- | --- |\n";
      group = s.group;
      first = false;
    }
    std::string type = type_text(s);
    if (s.lo != s.hi)
      type += std::visit([&](auto* p) -> std::string {
        using T = std::remove_pointer_t<decltype(p)>;
        if constexpr (std::is_arithmetic_v<T> && !std::is_same_v<T, bool>)
          return " [" + detail::number_text(static_cast<T>(s.lo)) + ", " + detail::number_text(static_cast<T>(s.hi)) + "]";
        else
          return "";
      }, b.target);
    std::string python = s.tools & kToolPythonModel ? "`Model(" + std::string(s.name) + "=)`"
                         : s.tools & kToolPythonGenerate ? "`generate(" + std::string(s.name) + "=)`" : "";
    std::string names;
    for (const std::string& n : CLI::detail::split(option_cli_names(s), ','))
      names += (names.empty() ? "" : ", ") + ("`" + n + "`");
    const std::string def = s.type == OptionType::kFlag ? (b.default_text == "true" ? "on" : "off") : b.default_text;
    std::string tools;
    if (s.tools & kToolInfer) tools = "infer";
    if (s.tools & kToolServer) tools += tools.empty() ? "server" : ", server";
    out += "| " + names + " | " + python + " | " + tools + " | " + type + " | " + (def.empty() ? "" : "`" + def + "`") + " | " +
           (s.env ? "`" + option_env_name(s) + "`" : "") + " | " +
           escape_cell(render_options(s.help, OptionCaller::kCli)) + " |\n";
  }
  return out;
}

}  // namespace moestream
