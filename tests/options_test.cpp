// The option table (runtime/engine/options.h): rows that agree with the fields they set, marks
// spelled for each caller, the rules as data, and the engine's own check.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <type_traits>

#include "common/option_ref.h"
#include "runtime/engine/options.h"
#include "tests/support/test_model.h"

namespace moestream {
namespace {

OptionType type_of(const OptionTarget& t) {
  return std::visit([](auto* p) {
    using T = std::remove_pointer_t<decltype(p)>;
    if constexpr (std::is_same_v<T, bool>) return OptionType::kFlag;
    else if constexpr (std::is_same_v<T, int>) return OptionType::kInt;
    else if constexpr (std::is_same_v<T, uint32_t>) return OptionType::kUint32;
    else if constexpr (std::is_same_v<T, uint64_t>) return OptionType::kUint64;
    else if constexpr (std::is_same_v<T, float>) return OptionType::kFloat;
    else if constexpr (std::is_same_v<T, std::string>) return OptionType::kText;
    else return OptionType::kList;
  }, t);
}

std::vector<std::string> split_names(const std::string& names) {
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t comma; (comma = names.find(',', start)) != std::string::npos; start = comma + 1)
    out.push_back(names.substr(start, comma - start));
  out.push_back(names.substr(start));
  return out;
}

TEST(OptionTable, RowsAreUniqueAndAgreeWithTheirFields) {
  std::set<std::string> names, flags;
  EngineSettings s;
  for (const OptionSpec& o : option_table()) {
    EXPECT_TRUE(names.insert(std::string(o.name)).second) << o.name;
    for (const std::string& f : split_names(option_cli_names(o))) EXPECT_TRUE(flags.insert(f).second) << f;
    EXPECT_FALSE(o.help.empty()) << o.name;
    EXPECT_NE(o.tools, 0u) << o.name;
    EXPECT_FALSE(o.env && o.negated) << o.name << ": an environment variable of a negated flag reads backwards";
    EXPECT_FALSE(o.negated && o.type != OptionType::kFlag) << o.name;
    if (o.tools & kToolPythonModel) EXPECT_NE(o.engine, nullptr) << o.name << ": a Model keyword needs its field";
    if (o.engine != nullptr) EXPECT_EQ(type_of(o.engine(s)), o.type) << o.name;
    EXPECT_LE(o.lo, o.hi) << o.name;
  }
  for (const OptionRule& r : option_rules()) {
    EXPECT_NE(find_option(r.option), nullptr) << r.option;
    EXPECT_NE(find_option(r.other), nullptr) << r.other;
  }
}

TEST(OptionTable, HelpTextNamesOnlyOptionsOfTheTable) {
  const std::set<std::string_view> other_tools = {"profile_out"};  // bench_io's
  for (const OptionSpec& o : option_table())
    render_option_refs(o.help, [&](std::string_view name, std::optional<std::string_view>) {
      EXPECT_TRUE(find_option(name) != nullptr || other_tools.count(name)) << o.name << "'s help names `" << name << "`";
      return std::optional<std::string>("x");
    });
}

TEST(OptionTable, EveryFlagKeepsItsSpelling) {
  EXPECT_EQ(option_flag(option("temperature")), "--temp");
  EXPECT_EQ(option_cli_names(option("verify_checksums")), "--no-verify,--no-verify-checksums");
  EXPECT_EQ(option_cli_names(option("auto_direct")), "--no-auto-direct");
  EXPECT_EQ(option_cli_names(option("threads")), "-t,--threads");
  EXPECT_EQ(option_cli_names(option("max_tokens")), "-n,--n-predict");
  EXPECT_EQ(option_flag(option("io_qd")), "--io-qd");
  EXPECT_EQ(option_env_name(option("io_qd")), "MOESTREAM_IO_QD");
}

TEST(OptionMarks, EachCallerReadsItsOwnSpelling) {
  const std::string text = option_ref("gpu_preload", "true") + " needs " + option_ref("gpu", "true") + "; " +
                           option_ref("moe_lookahead", "4") + ", " + option_ref("auto_direct", "false") + ", " +
                           option_ref("temperature") + ", " + option_ref("max_tokens") + ", " + option_ref("quant", "q8") + ", `Not a mark`";
  EXPECT_EQ(render_options(text, OptionCaller::kCli),
            "--gpu-preload needs --gpu; --moe-lookahead 4, --no-auto-direct, --temp, --n-predict, --quant q8, `Not a mark`");
  EXPECT_EQ(render_options(text, OptionCaller::kPython),
            "gpu_preload=True needs gpu=True; moe_lookahead=4, auto_direct=False, temperature, max_tokens, "
            "--quant q8, `Not a mark`");
  // A server's client: the operator's flags as flags, the request's own fields by their JSON name.
  EXPECT_EQ(render_options(text, OptionCaller::kServerRequest),
            "--gpu-preload needs --gpu; --moe-lookahead 4, --no-auto-direct, temperature, max_tokens, "
            "--quant q8, `Not a mark`");
  EXPECT_EQ(render_options(option_ref("ignore_eos", "true"), OptionCaller::kServerRequest), "ignore_eos=true");
}

TEST(OptionMarks, ToolsWithoutTheTableUseThePlainFlagRule) {
  EXPECT_EQ(render_option_refs_as_flags("raise " + option_ref("io_qd", "8") + " or " + option_ref("gpu", "true") +
                                        " or " + option_ref("auto_direct", "false")),
            "raise --io-qd 8 or --gpu or --no-auto-direct");
  EXPECT_EQ(render_option_refs_as_flags("a lone ` and `Upper`"), "a lone ` and `Upper`");
}

TEST(OptionRules, ABrokenRuleNamesBothOptionsAndWhy) {
  const std::vector<OptionValue> union_alone = {{&option("cache_aware_union"), true}, {&option("cache_aware"), false}};
  const std::string msg = test::error_message<ConfigError>([&] { check_option_rules(union_alone, kToolInfer); });
  EXPECT_EQ(render_options(msg, OptionCaller::kCli),
            "--cache-aware-union needs --cache-aware: it is a rule of cache-aware routing");
  EXPECT_EQ(render_options(msg, OptionCaller::kPython),
            "cache_aware_union=True needs cache_aware=True: it is a rule of cache-aware routing");
  const std::vector<OptionValue> both = {{&option("cache_aware_union"), true}, {&option("cache_aware"), true}};
  EXPECT_NO_THROW(check_option_rules(both, kToolInfer));
  // A rule of one tool binds no other: infer's --parallel needs --perplexity, the server's does not.
  const std::vector<OptionValue> parallel = {{&option("parallel"), true}, {&option("perplexity"), false}};
  EXPECT_THROW(check_option_rules(parallel, kToolInfer), ConfigError);
  EXPECT_NO_THROW(check_option_rules(parallel, kToolServer));
  // A rule naming an option the caller does not have is not its rule (Model::load's check).
  EXPECT_NO_THROW(check_option_rules(std::vector<OptionValue>{{&option("parallel"), true}}, kToolInfer));
}

TEST(OptionRules, TheEngineChecksModelOptionsItself) {
  ModelOptions mo;
  mo.gpu_cache_mb = 8;
  EXPECT_EQ(render_options(test::error_message<ConfigError>([&] { check_model_options(mo); }), OptionCaller::kCli),
            "--gpu-cache-mb needs --gpu");
  mo = {};
  mo.moe_lookahead = -1;
  EXPECT_NE(test::error_message<ConfigError>([&] { check_model_options(mo); }).find("`moe_lookahead` must be >= 0"),
            std::string::npos);
  EXPECT_NO_THROW(check_model_options(ModelOptions{}));
}

TEST(OptionValues, EnvironmentTextIsCheckedLikeAFlag) {
  EngineSettings s;
  const OptionSpec& qd = option("io_qd");
  set_option_text(qd, qd.engine(s), "8", "MOESTREAM_IO_QD");
  EXPECT_EQ(s.store.io_qd, 8u);
  const std::string msg = test::error_message<ConfigError>([&] { set_option_text(qd, qd.engine(s), "0", "env"); });
  EXPECT_NE(msg.find("`io_qd` from env must be in [1, 4096], got 0"), std::string::npos) << msg;
  EXPECT_THROW(set_option_text(qd, qd.engine(s), "8x", "env"), ConfigError);
  EXPECT_THROW(set_option_text(qd, qd.engine(s), "-1", "env"), ConfigError);
  const OptionSpec& gpu = option("gpu");
  set_option_text(gpu, gpu.engine(s), "1", "env");
  EXPECT_TRUE(s.model.gpu);
  EXPECT_THROW(set_option_text(gpu, gpu.engine(s), "yes please", "env"), ConfigError);
}

}  // namespace
}  // namespace moestream
