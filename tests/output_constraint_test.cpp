// runtime/grammar/output_constraint.h against the demo model's byte-level BPE vocabulary: masks
// allow exactly the tokens that continue the output, random walks through the allowed tokens end
// in text that parses and matches, and bad schemas or grammars are refused with a message.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <set>
#include <random>
#include <string>

#include <nlohmann/json.hpp>

#include "runtime/grammar/output_constraint.h"
#include "runtime/grammar/tool_call_constraint.h"
#include "runtime/model/sampler.h"
#include "runtime/tokenizer/tokenizer.h"

using namespace moestream;

namespace {
constexpr int kEos = 0;        // <|endoftext|>
constexpr int kImStart = 1;    // <|im_start|>: special, not a stop token
constexpr int kImEnd = 2;      // <|im_end|>

const Tokenizer& demo_tokenizer() {
  static const Tokenizer tok = Tokenizer::load(std::string(MOESTREAM_SOURCE_DIR) + "/models/demo/tokenizer.json");
  return tok;
}

// The model's logits may be wider than the tokenizer's vocabulary (padding): 8 extra columns.
int logits_width() { return demo_tokenizer().vocab_size() + 8; }

const ConstraintCompiler& compiler() {
  static const ConstraintCompiler c(demo_tokenizer(), logits_width(), {kEos, kImEnd});
  return c;
}

std::vector<int> allowed(ConstraintMatcher& m) {
  std::vector<float> logits(size_t(logits_width()), 0.0f);
  m.mask(logits);
  std::vector<int> ids;
  for (size_t i = 0; i < logits.size(); ++i)
    if (std::isfinite(logits[i])) ids.push_back(int(i));
  return ids;
}

// Draws uniformly from the allowed tokens until the matcher terminates; past `min_tokens`, a stop
// token as soon as one is allowed, else one that closes a string, object or array when there is
// one (uniform draws inside an open string would almost never close it). Returns the text,
// without the stop token.
std::string random_walk(const ConstraintSpec& spec, uint64_t seed, int max_tokens = 400, int min_tokens = 0) {
  ConstraintMatcher m(compiler().compile(spec));
  std::mt19937_64 rng(seed);
  std::vector<int32_t> out;
  for (int step = 0; step < max_tokens && !m.terminated(); ++step) {
    const std::vector<int> ids = allowed(m);
    EXPECT_FALSE(ids.empty()) << "no token allowed after " << out.size() << " tokens";
    if (ids.empty()) break;
    std::vector<int> pick = ids;
    if (step >= min_tokens) {
      std::vector<int> stops, closing;
      for (int s : ids) {
        if (s == kEos || s == kImEnd) stops.push_back(s);
        else if (demo_tokenizer().decode(std::vector<int32_t>{s}).find_first_of("\"}]") != std::string::npos)
          closing.push_back(s);
      }
      if (!stops.empty()) pick = stops;
      else if (!closing.empty()) pick = closing;
    }
    const int id = pick[std::uniform_int_distribution<size_t>(0, pick.size() - 1)(rng)];
    m.accept(id);
    if (id != kEos && id != kImEnd) out.push_back(id);
  }
  EXPECT_TRUE(m.terminated()) << "no end after " << max_tokens << " tokens: " << demo_tokenizer().decode(out).substr(0, 300);
  return demo_tokenizer().decode(out);
}
}  // namespace

TEST(OutputConstraint, FirstMaskOfAnObjectAllowsOnlyWhitespaceOrABrace) {
  ConstraintMatcher m(compiler().compile({ConstraintSpec::Kind::kJsonObject, "", false}));
  const std::vector<int> ids = allowed(m);
  ASSERT_FALSE(ids.empty());
  bool brace = false;
  for (int id : ids) {
    ASSERT_LT(id, demo_tokenizer().vocab_size()) << "a padding column is allowed";
    EXPECT_NE(id, kEos);  // nothing written yet: the output cannot end
    EXPECT_NE(id, kImEnd);
    EXPECT_NE(id, kImStart);
    const std::string t = demo_tokenizer().decode(std::vector<int32_t>{id});
    const size_t first = t.find_first_not_of(" \t\n\r");
    ASSERT_TRUE(first == std::string::npos || t[first] == '{') << "token " << id << " '" << t << "'";
    brace |= first != std::string::npos;
  }
  EXPECT_TRUE(brace);
}

TEST(OutputConstraint, RandomWalksThroughASchemaEndInMatchingJson) {
  const std::string schema = R"({"type": "object", "properties": {
      "colour": {"enum": ["red", "green", "blue"]}, "ok": {"type": "boolean"},
      "n": {"type": "integer", "minimum": 0, "maximum": 99}, "tag": {"const": "x"}},
      "required": ["colour", "ok", "n", "tag"], "additionalProperties": false})";
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    const std::string text = random_walk({ConstraintSpec::Kind::kJsonSchema, schema, true}, seed);
    nlohmann::json j;
    ASSERT_NO_THROW(j = nlohmann::json::parse(text)) << text;
    ASSERT_TRUE(j.is_object()) << text;
    EXPECT_EQ(j.size(), 4u) << text;
    const std::string c = j.at("colour").get<std::string>();
    EXPECT_TRUE(c == "red" || c == "green" || c == "blue") << text;
    EXPECT_TRUE(j.at("ok").is_boolean()) << text;
    ASSERT_TRUE(j.at("n").is_number_integer()) << text;
    EXPECT_GE(j["n"].get<int>(), 0) << text;
    EXPECT_LE(j["n"].get<int>(), 99) << text;
    EXPECT_EQ(j.at("tag"), "x") << text;
  }
}

TEST(OutputConstraint, JsonObjectWalksParseAsObjects) {
  for (uint64_t seed = 1; seed <= 10; ++seed) {
    // 30 free tokens, then the walk heads for the end.
    const std::string text = random_walk({ConstraintSpec::Kind::kJsonObject, "", false}, seed, 400, 30);
    nlohmann::json j;
    ASSERT_NO_THROW(j = nlohmann::json::parse(text)) << text;
    EXPECT_TRUE(j.is_object()) << text;
  }
}

TEST(OutputConstraint, GrammarAllowsOnlyItsSentences) {
  const ConstraintSpec g{ConstraintSpec::Kind::kGrammar, R"(root ::= "yes" | "no" | "maybe" [0-9]+)", true};
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    const std::string text = random_walk(g, seed);
    EXPECT_TRUE(text == "yes" || text == "no" || (text.rfind("maybe", 0) == 0 && text.size() > 5 &&
                text.find_first_not_of("0123456789", 5) == std::string::npos)) << text;
  }
}

TEST(OutputConstraint, AForbiddenTokenIsRefusedAndStopEndsTheOutput) {
  ConstraintMatcher m(compiler().compile({ConstraintSpec::Kind::kGrammar, R"(root ::= "a")", true}));
  const std::optional<int32_t> b = demo_tokenizer().token_id("b");
  const std::optional<int32_t> a = demo_tokenizer().token_id("a");
  ASSERT_TRUE(a && b);
  EXPECT_THROW(m.accept(*b), ConstraintError);
  m.accept(*a);
  EXPECT_FALSE(m.terminated());
  EXPECT_EQ(allowed(m), (std::vector<int>{kEos, kImEnd}));
  m.accept(kImEnd);
  EXPECT_TRUE(m.terminated());
}

TEST(OutputConstraint, BadSchemasAndGrammarsAreRefusedWithAMessage) {
  const auto message = [](const ConstraintSpec& s) {
    try {
      compiler().compile(s);
    } catch (const ConstraintError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(message({ConstraintSpec::Kind::kJsonSchema, "{not json", true}), "");
  EXPECT_NE(message({ConstraintSpec::Kind::kJsonSchema, R"({"type": "no-such-type"})", true}), "");
  // Keywords the decoder would not enforce are refused, not ignored; a property of that name is fine.
  EXPECT_NE(message({ConstraintSpec::Kind::kJsonSchema,
                     R"({"type": "object", "properties": {"a": {"type": "array", "uniqueItems": true}}})", true})
                .find("uniqueItems\" at /properties/a"), std::string::npos);
  EXPECT_NE(message({ConstraintSpec::Kind::kJsonSchema, R"({"anyOf": [{"not": {"type": "null"}}]})", true}), "");
  EXPECT_EQ(message({ConstraintSpec::Kind::kJsonSchema,
                     R"({"type": "object", "properties": {"not": {"enum": ["if"]}}, "required": ["not"]})", true}), "");
  EXPECT_NE(message({ConstraintSpec::Kind::kGrammar, "root ::= ", true}), "");
  EXPECT_NE(message({ConstraintSpec::Kind::kGrammar, R"(root ::= undefined_rule)", true}), "");
  EXPECT_NE(message({ConstraintSpec::Kind::kGrammar, R"(start ::= "a")", true}), "");  // no root
}

// Each sequence of a batch keeps its own place: two matchers of one compiled schema advance apart.
TEST(OutputConstraint, MatchersOfOneConstraintAreIndependent) {
  auto c = compiler().compile({ConstraintSpec::Kind::kGrammar, R"(root ::= "ab" | "b")", true});
  ConstraintMatcher m1(c), m2(c);
  const std::optional<int32_t> a = demo_tokenizer().token_id("a");
  ASSERT_TRUE(a);
  m1.accept(*a);
  const std::vector<int> first = allowed(m2);
  EXPECT_NE(std::find(first.begin(), first.end(), *a), first.end());  // m2 has not moved
  const std::vector<int> after_a = allowed(m1);
  for (int id : after_a) EXPECT_EQ(demo_tokenizer().decode(std::vector<int32_t>{id}), "b");
}

namespace {
// Seeded random logits over the demo vocabulary.
std::vector<float> random_logits(uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> n(0.0f, 2.0f);
  std::vector<float> l(static_cast<size_t>(logits_width()));
  for (float& x : l) x = n(rng);
  return l;
}
std::vector<int> letter_ids() {
  std::vector<int> ids;
  for (const char* t : {"a", "b", "c", "d", "e"}) ids.push_back(*demo_tokenizer().token_id(t));
  return ids;
}
}  // namespace

// ConstraintMatcher::sample draws from the raw logits first and masks only on a refusal; the
// draws must still follow softmax over the allowed tokens (within 4 sigma over 20000 draws).
TEST(OutputConstraint, SampleFollowsTheMaskedDistribution) {
  const auto c = compiler().compile({ConstraintSpec::Kind::kGrammar, "root ::= [a-e]", true});
  std::vector<float> logits = random_logits(3);
  const std::vector<int> ids = letter_ids();
  logits[size_t(ids[0])] = 6.0f;  // one allowed token likely enough that the raw draw often keeps it
  double z = 0;
  for (int id : ids) z += std::exp(double(logits[size_t(id)]));
  SamplerParams sp;
  sp.temperature = 1.0f;
  sp.top_k = 0;
  sp.top_p = 1.0f;
  sp.seed = 11;
  Sampler sampler(sp);
  std::map<int, int> count;
  const int n = 20000;
  for (int i = 0; i < n; ++i) {
    ConstraintMatcher m(c);
    ++count[m.sample(sampler, logits)];
  }
  for (const auto& [id, k] : count) EXPECT_NE(std::find(ids.begin(), ids.end(), id), ids.end()) << id;
  for (int id : ids) {
    const double p = std::exp(double(logits[size_t(id)])) / z;
    const double sigma = std::sqrt(n * p * (1 - p));
    EXPECT_NEAR(count[id], n * p, 4 * sigma + 1) << "token " << id;
  }
}

// Greedy takes the largest allowed logit; with filters (top_k 1) the mask comes before them.
TEST(OutputConstraint, GreedyAndFilteredSamplesTakeTheBestAllowedToken) {
  const auto c = compiler().compile({ConstraintSpec::Kind::kGrammar, "root ::= [a-e]", true});
  const std::vector<float> logits = random_logits(5);
  const std::vector<int> ids = letter_ids();
  int best = ids[0];
  for (int id : ids)
    if (logits[size_t(id)] > logits[size_t(best)]) best = id;
  for (const auto& [temperature, top_k] : {std::pair{0.0f, 0}, std::pair{1.0f, 1}}) {
    SamplerParams sp;
    sp.temperature = temperature;
    sp.top_k = top_k;
    sp.top_p = 1.0f;
    Sampler sampler(sp);
    ASSERT_EQ(sampler.filters(), top_k == 1);
    ConstraintMatcher m(c);
    EXPECT_EQ(m.sample(sampler, logits), best) << "temperature " << temperature;
    EXPECT_EQ(allowed(m), (std::vector<int>{kEos, kImEnd}));  // the token was accepted
  }
}

namespace {
const nlohmann::ordered_json kTools = nlohmann::ordered_json::parse(R"([
  {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
    "properties": {"city": {"enum": ["Paris", "Oslo"]}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city", "days"], "additionalProperties": false}}},
  {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object",
    "properties": {"zone": {"const": "UTC"}}, "required": ["zone"], "additionalProperties": false}}}])");

// The calls of a Hermes-markup reply: (name, arguments) each; fails the test on other text.
std::vector<std::pair<std::string, nlohmann::json>> hermes_calls(const std::string& text) {
  std::vector<std::pair<std::string, nlohmann::json>> out;
  const std::string open = "<tool_call>\n", close = "\n</tool_call>";
  size_t pos = 0;
  while (pos < text.size()) {
    if (!out.empty()) {
      EXPECT_EQ(text[pos], '\n') << text;
      ++pos;
    }
    EXPECT_EQ(text.compare(pos, open.size(), open), 0) << text;
    const size_t end = text.find(close, pos);
    if (end == std::string::npos) {
      ADD_FAILURE() << "unclosed call: " << text;
      break;
    }
    const nlohmann::json call = nlohmann::json::parse(text.substr(pos + open.size(), end - pos - open.size()));
    out.emplace_back(call.at("name").get<std::string>(), call.at("arguments"));
    pos = end + close.size();
  }
  return out;
}
}  // namespace

TEST(ToolCallConstraint, RequiredGivesCallsOfListedToolsWithValidArguments) {
  const ConstraintSpec spec = tool_call_constraint(ToolCallMarkup::kHermes, kTools, {});
  std::set<std::string> seen;
  for (uint64_t seed = 1; seed <= 12; ++seed) {
    const auto calls = hermes_calls(random_walk(spec, seed));
    ASSERT_FALSE(calls.empty());
    for (const auto& [name, args] : calls) {
      seen.insert(name);
      if (name == "get_weather") {
        EXPECT_TRUE(args.at("city") == "Paris" || args.at("city") == "Oslo") << args;
        EXPECT_GE(args.at("days").get<int>(), 1);
        EXPECT_LE(args.at("days").get<int>(), 7);
        EXPECT_EQ(args.size(), 2u);
      } else {
        EXPECT_EQ(name, "get_time");
        EXPECT_EQ(args, nlohmann::json({{"zone", "UTC"}}));
      }
    }
  }
  EXPECT_EQ(seen.size(), 2u);  // both tools are reachable
}

TEST(ToolCallConstraint, ANamedFunctionIsCalledOnce) {
  const ConstraintSpec spec = tool_call_constraint(ToolCallMarkup::kHermes, kTools, {"get_time"});
  for (uint64_t seed = 1; seed <= 5; ++seed) {
    const auto calls = hermes_calls(random_walk(spec, seed));
    ASSERT_EQ(calls.size(), 1u);
    EXPECT_EQ(calls[0].first, "get_time");
  }
}

TEST(ToolCallConstraint, ThinkingMayComeFirst) {
  const ConstraintSpec spec = tool_call_constraint(ToolCallMarkup::kHermes, kTools, {"get_time", true, true});
  ConstraintMatcher m(compiler().compile(spec));
  const std::vector<int32_t> think = demo_tokenizer().encode("<think>\nhm\n</think>\n\n", false);
  for (int32_t id : think) ASSERT_TRUE(m.try_accept(id)) << "token " << id;
  for (int32_t id : demo_tokenizer().encode("<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"zone\": \"UTC\"}}\n</tool_call>", false))
    ASSERT_TRUE(m.try_accept(id)) << "token " << id;
  EXPECT_TRUE(m.try_accept(kImEnd));
  EXPECT_TRUE(m.terminated());
}

TEST(ToolCallConstraint, BadToolsAndUnknownNamesAreRefused) {
  EXPECT_THROW(tool_call_constraint(ToolCallMarkup::kHermes, nlohmann::ordered_json::array(), {}), ConstraintError);
  EXPECT_THROW(tool_call_constraint(ToolCallMarkup::kHermes, kTools, {"nope"}), ConstraintError);
  EXPECT_THROW(tool_call_constraint(ToolCallMarkup::kHermes, nlohmann::ordered_json::parse(R"([{"type": "function"}])"), {}),
               ConstraintError);
}
