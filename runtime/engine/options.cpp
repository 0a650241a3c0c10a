// Implementation of runtime/engine/options.h beside the table (options_table.cpp): look-ups,
// spelling, the rules' check.
#include "runtime/engine/options.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdlib>
#include <system_error>
#include <sstream>
#include <type_traits>

#include "common/checked.h"
#include "common/error.h"
#include "common/option_ref.h"

namespace moestream {

std::string_view option_group_title(OptionGroup g) {
  switch (g) {
    case OptionGroup::kModel: return "Model and run";
    case OptionGroup::kChat: return "Chat in the terminal";
    case OptionGroup::kSampling: return "Sampling";
    case OptionGroup::kIoStore: return "I/O and store";
    case OptionGroup::kGpu: return "GPU";
    case OptionGroup::kRouting: return "Routing and cache-aware";
    case OptionGroup::kBenchmarking: return "Benchmarking";
    case OptionGroup::kServer: return "Server";
  }
  MOE_ASSERT(false, "unknown option group");
  return "";
}

ModelOptions EngineSettings::model_options() const {
  ModelOptions m = model;
  m.max_batch = batch > 0 ? batch : default_max_batch(m.gpu);
  return m;
}

const OptionSpec* find_option(std::string_view name) {
  for (const OptionSpec& s : option_table())
    if (s.name == name) return &s;
  return nullptr;
}

const OptionSpec& option(std::string_view name) {
  const OptionSpec* s = find_option(name);
  MOE_ASSERT(s != nullptr, "no option of that name in the table");
  return *s;
}

std::string option_env_name(const OptionSpec& s) {
  std::string e = "MOESTREAM_";
  for (char c : s.name) e += char(std::toupper(static_cast<unsigned char>(c)));
  return e;
}

namespace {

std::string dashed(std::string_view name) {
  std::string d(name);
  std::replace(d.begin(), d.end(), '_', '-');
  return d;
}

// The extra CLI names, without dashes.
std::vector<std::string> cli_names(std::string_view cli) {
  std::vector<std::string> out;
  std::stringstream ss{std::string(cli)};
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

// The name an option's flag derives from its own: dashes for underscores, "no-" when negated.
std::string derived_name(const OptionSpec& s) { return (s.negated ? "no-" : "") + dashed(s.name); }

bool is_true(std::string_view v) { return v == "true" || v == "True" || v == "1"; }
bool is_false(std::string_view v) { return v == "false" || v == "False" || v == "0"; }

std::optional<std::string> spell_cli(const OptionSpec& s, std::optional<std::string_view> v) {
  const std::string flag = option_flag(s);
  if (s.type == OptionType::kFlag) {
    if (!v || (s.negated ? is_false(*v) : is_true(*v))) return flag;
    // The value the flag does not set: the plain name (no flag spells it).
    return std::string(s.name) + "=" + std::string(*v);
  }
  return v ? flag + " " + std::string(*v) : flag;
}

std::optional<std::string> spell_keyword(const OptionSpec& s, std::optional<std::string_view> v) {
  std::string k(s.name);
  if (!v) return k;
  if (s.type == OptionType::kFlag) return k + (is_true(*v) ? "=True" : is_false(*v) ? "=False" : "=" + std::string(*v));
  return k + "=" + std::string(*v);
}

}  // namespace

std::string option_flag(const OptionSpec& s) {
  // A long alias is the spelling in messages (a negated option's short one, a renamed option's
  // only one); otherwise the derived name.
  for (const std::string& n : cli_names(s.cli))
    if (n.size() > 1) return cli_flag(n);
  return cli_flag(derived_name(s));
}

std::string option_cli_names(const OptionSpec& s) {
  std::string names;
  bool has_long = false;
  for (const std::string& n : cli_names(s.cli)) {
    names += (names.empty() ? "" : ",") + cli_flag(n);
    has_long |= n.size() > 1;
  }
  // The derived name is kept beside an alias of a negated option (verify_checksums keeps its
  // no-verify-checksums), and replaced by an explicit long name otherwise.
  if (!has_long || s.negated) names += (names.empty() ? "" : ",") + cli_flag(derived_name(s));
  return names;
}

std::string render_options(std::string_view text, OptionCaller caller) {
  return render_option_refs(text, [caller](std::string_view name, std::optional<std::string_view> v)
                                      -> std::optional<std::string> {
    const OptionSpec* s = find_option(name);
    if (s == nullptr) return option_flag_by_rule(name, v);  // another tool's flag (convert_model `quant`)
    switch (caller) {
      case OptionCaller::kCli: return spell_cli(*s, v);
      case OptionCaller::kPython: return spell_keyword(*s, v);
      case OptionCaller::kServerRequest:
        // The operator's flags as flags; the rest are the request's own JSON fields.
        if (s->tools & kToolServer) return spell_cli(*s, v);
        return v ? std::string(s->name) + "=" + std::string(*v) : std::string(s->name);
    }
    return std::nullopt;
  });
}

std::string option_value_text(const OptionTarget& t) {
  return std::visit([](auto* p) -> std::string {
    using T = std::remove_pointer_t<decltype(p)>;
    if constexpr (std::is_same_v<T, bool>) return *p ? "true" : "false";
    else if constexpr (std::is_same_v<T, std::string>) return *p;
    else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
      std::string out;
      for (const std::string& x : *p) out += (out.empty() ? "" : " ") + x;
      return out;
    } else if constexpr (std::is_same_v<T, float>) return detail::number_text(*p);
    else return std::to_string(*p);
  }, t);
}

namespace {
template <class T>
T parse_number(const OptionSpec& s, std::string_view text, std::string_view source) {
  T v{};
  const char* end = text.data() + text.size();
  bool ok = false;
  if constexpr (std::is_integral_v<T>) {
    const auto [p, ec] = std::from_chars(text.data(), end, v);
    ok = !text.empty() && ec == std::errc() && p == end;
  } else {
    const std::string t(text);
    char* stop = nullptr;
    v = std::strtof(t.c_str(), &stop);
    ok = !t.empty() && stop == t.c_str() + t.size();
  }
  if (!ok)
    throw ConfigError(option_ref(s.name) + " from " + std::string(source) + ": '" + std::string(text) +
                      "' is not a valid number");
  if (s.lo != s.hi)
    check_range(option_ref(s.name) + " from " + std::string(source), v, static_cast<T>(s.lo), static_cast<T>(s.hi));
  return v;
}
}  // namespace

void set_option_text(const OptionSpec& s, const OptionTarget& t, std::string_view text, std::string_view source) {
  std::visit([&](auto* p) {
    using T = std::remove_pointer_t<decltype(p)>;
    if constexpr (std::is_same_v<T, bool>) {
      if (is_true(text)) *p = true;
      else if (is_false(text)) *p = false;
      else
        throw ConfigError(option_ref(s.name) + " from " + std::string(source) + ": '" + std::string(text) +
                          "' is not true, false, 1 or 0");
    } else if constexpr (std::is_same_v<T, std::string>) {
      *p = std::string(text);
    } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
      p->assign(1, std::string(text));
    } else {
      *p = parse_number<T>(s, text, source);
    }
  }, t);
}

namespace {
// The mark of an option in a rule's message: a flag as `name=true` (a keyword reads gpu=True, a
// flag `gpu`), a negated one as `name=false`, a value as `name`.
std::string rule_ref(const OptionSpec& s) {
  if (s.type == OptionType::kFlag) return option_ref(s.name, s.negated ? "false" : "true");
  return option_ref(s.name);
}
}  // namespace

void check_option_rules(std::span<const OptionValue> values, unsigned tool) {
  const auto in_effect = [&](std::string_view name) -> std::optional<bool> {
    for (const OptionValue& v : values)
      if (v.spec->name == name) return v.in_effect;
    return std::nullopt;
  };
  for (const OptionRule& r : option_rules()) {
    const std::optional<bool> one = in_effect(r.option), other_given = in_effect(r.other);
    if (!(r.tools & tool) || !one || !other_given || !*one) continue;
    const bool other = *other_given;
    if (r.kind == RuleKind::kRequires && other) continue;
    if (r.kind == RuleKind::kExcludes && !other) continue;
    std::string msg = rule_ref(option(r.option)) +
                      (r.kind == RuleKind::kRequires ? " needs " : " excludes ") + rule_ref(option(r.other));
    if (!r.why.empty()) msg += ": " + std::string(r.why);
    throw ConfigError(msg);
  }
}

void check_model_options(const ModelOptions& opts) {
  if (opts.moe_lookahead < 0)
    throw ConfigError(option_ref("moe_lookahead") + " must be >= 0, got " + std::to_string(opts.moe_lookahead));
  // The rules between options ModelOptions holds (those naming another are the front ends').
  EngineSettings now, defaults;
  now.model = opts;
  const auto* begin = reinterpret_cast<const char*>(&now.model);
  std::vector<OptionValue> values;
  for (const OptionSpec& s : option_table()) {
    if (s.engine == nullptr) continue;
    const OptionTarget t = s.engine(now);
    const auto* at = std::visit([](auto* p) { return reinterpret_cast<const char*>(p); }, t);
    if (std::less_equal<>()(begin, at) && std::less<>()(at, begin + sizeof(ModelOptions)))
      values.push_back({&s, option_value_text(t) != option_value_text(s.engine(defaults))});
  }
  check_option_rules(values, kToolPythonModel | kToolInfer | kToolServer);
  if (opts.gpu) {
    const std::string why = gpu_unavailable_reason();
    if (!why.empty()) throw ConfigError(option_ref("gpu") + ": " + why);
  }
}

}  // namespace moestream
