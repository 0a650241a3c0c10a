// Chat-template limits: hostile nesting, sizes and integer arithmetic in templates and their
// inputs end in a ChatTemplateError naming the limit, never a stack overflow, a silently cut
// string or a wrapped number. (Renderings against jinja2 are in tests/python/test_chat_template.py.)
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include <unistd.h>

#include "runtime/chat/chat_prompt.h"
#include "runtime/chat/chat_template.h"
#include "tests/support/chat_render.h"

namespace moestream {
namespace {

using OJ = nlohmann::ordered_json;
using namespace test;  // render, expect_error, expect_parse_error, expect_render_error, repeat

// [[[...]]] with `levels` lists; built without recursion.
OJ nested_lists(int levels) {
  OJ v = OJ::array();
  for (int i = 1; i < levels; ++i) v = OJ::array({std::move(v)});
  return v;
}

TEST(ChatTemplateLimits, SourceOverTheSizeLimitIsRefused) {
  expect_parse_error(std::string(kMaxTemplateBytes + 1, 'x'), "over the limit of 1048576 bytes");
  EXPECT_EQ(render(std::string(kMaxTemplateBytes, 'x')).size(), kMaxTemplateBytes);
}

TEST(ChatTemplateLimits, DeeplyNestedBlocksAreRefused) {
  expect_parse_error(repeat("{% if true %}", 10000) + "x" + repeat("{% endif %}", 10000),
                     "nest deeper than the limit of 64 levels");
  expect_parse_error(repeat("{% for a in [1] %}", 10000) + repeat("{% endfor %}", 10000), "limit of 64 levels");
  const int n = kMaxTemplateBlockDepth;
  EXPECT_EQ(render(repeat("{% if true %}", n) + "x" + repeat("{% endif %}", n)), "x");
  expect_parse_error(repeat("{% if true %}", n + 1) + "x" + repeat("{% endif %}", n + 1), "limit of 64");
}

TEST(ChatTemplateLimits, DeeplyNestedExpressionsAreRefused) {
  const size_t big = 100000;
  const std::string kLimit = "nest deeper than the limit of 128 levels";
  expect_parse_error("{{ " + repeat("(", big) + "1" + repeat(")", big) + " }}", kLimit);
  expect_parse_error("{{ " + repeat("[", big) + repeat("]", big) + " }}", kLimit);
  expect_parse_error("{{ " + repeat("-", big) + "1 }}", kLimit);
  expect_parse_error("{{ " + repeat("not ", big) + "1 }}", kLimit);
  expect_parse_error("{{ " + repeat("1 if x else ", big / 2) + "2 }}", kLimit);
  // Chains build a deep tree without recursing in the parser; evaluating it would.
  expect_parse_error("{{ 1" + repeat(" + 1", big) + " }}", kLimit);
  expect_parse_error("{{ x" + repeat(".a", big) + " }}", kLimit);
  expect_parse_error("{{ x" + repeat("|trim", big) + " }}", kLimit);
  expect_parse_error("{{ x" + repeat("[0]", big) + " }}", kLimit);
  expect_parse_error("{% set y = x" + repeat("(1)", big) + " %}", kLimit);
  // Up to the limit they parse and evaluate.
  const size_t n = kMaxTemplateExprDepth - 2;
  EXPECT_EQ(render("{{ " + repeat("(", n) + "7" + repeat(")", n) + " }}"), "7");
  EXPECT_EQ(render("{{ 0" + repeat(" + 1", n) + " }}"), std::to_string(n));
}

TEST(ChatTemplateLimits, IntegerLiteralOutsideInt64IsRefused) {
  expect_parse_error("{{ 99999999999999999999 }}", "outside the 64-bit range");
  EXPECT_EQ(render("{{ 9223372036854775807 }}"), "9223372036854775807");
}

TEST(ChatTemplateLimits, DeeplyNestedInputsAreRefusedNamingTheInput) {
  const OJ deep = nested_lists(100000);
  ChatPrompt p("{{ messages | length }}{{ tools | tojson }}");
  expect_error([&] { p.render(deep, false); }, "input 'messages' nests deeper than the limit of 128");
  expect_error([&] { p.render(OJ::array(), false, deep); }, "input 'tools'");
  // Deep values are moved into place, never copied: a copy of one would recurse in the test itself.
  OJ extra = OJ::object();
  extra["enable_thinking"] = nested_lists(100000);
  expect_error([&] { p.render(OJ::array(), false, nullptr, extra); }, "input 'enable_thinking'");
  OJ ctx = OJ::object();
  ctx["messages"] = OJ::array();
  ctx["x"] = nested_lists(100000);
  expect_render_error("{{ x }}", "input 'x'", ctx);
  // At the limit the input renders.
  std::string want = repeat("[", kMaxTemplateValueDepth);  // appended, not `"0" + ...`: GCC 12 -Wrestrict
  want.insert(0, 1, '0');
  want += repeat("]", kMaxTemplateValueDepth);
  EXPECT_EQ(p.render(OJ::array(), false, nested_lists(kMaxTemplateValueDepth)), want);
}

TEST(ChatTemplateLimits, ValuesBuiltUpByTheTemplateAreBounded) {
  expect_render_error(
      "{% set ns = namespace(v=1) %}{% for i in range(100000) %}{% set ns.v = [ns.v] %}{% endfor %}",
      "set v: the value nests deeper than the limit of 128");
  // Serializers refuse what one expression nests past the limit (an input at the limit, wrapped).
  OJ ctx = OJ::object();
  ctx["m"] = nested_lists(kMaxTemplateValueDepth);
  expect_render_error("{{ [[m]] | tojson }}", "tojson of a value nested deeper than the limit of 128", ctx);
  expect_render_error("{{ [[m]] }}", "printing a value nested deeper than the limit of 128", ctx);
}

TEST(ChatTemplateLimits, StringRepetitionOverTheLimitIsRefusedNotCut) {
  expect_render_error("{{ 'ab' * 100000000 }}", "string repetition of 2 bytes * 100000000");
  expect_render_error("{{ 'x' * 9223372036854775807 }}", "limit of 16 MiB");
  EXPECT_EQ(render("{{ 'ab' * 3 }}|{{ 'a' * -2 }}|{{ '' * 9223372036854775807 }}"), "ababab||");
  // 200,000 was cut to 100,000 copies before; it is well under the limit and now comes out whole.
  EXPECT_EQ(render("{{ ('x' * 200000) | length }}"), "200000");
}

TEST(ChatTemplateLimits, GrowingStringsAndListsAreRefused) {
  const std::string loop = "{% set ns = namespace(v=X) %}{% for i in range(64) %}{% set ns.v = OP %}{% endfor %}";
  auto with = [&](const std::string& x, const std::string& op) {
    std::string s = loop;
    s.replace(s.find("X"), 1, x);
    s.replace(s.find("OP"), 2, op);
    return s;
  };
  expect_render_error(with("'x'", "ns.v + ns.v"), "the result of + would be larger than the limit of 16 MiB");
  expect_render_error(with("'x'", "ns.v ~ ns.v"), "the result of ~");
  expect_render_error(with("'x'", "range(3) | join(ns.v)"), "the result of join");
  expect_render_error(with("'x' * 8", "ns.v | replace('xxxxxxxx', 'x' * 16)"), "the result of replace");
  expect_render_error(with("'x' * 8", "ns.v.replace('xxxxxxxx', 'x' * 16)"), "the result of replace");
  expect_render_error(with("[1]", "ns.v + ns.v"), "over the limit of 1000000");
  expect_render_error(with("['x' * 1000000]", "ns.v + ns.v"), "the result of list + list");
  expect_render_error("{% set s = 'x' * 15000000 %}{{ [s, s] }}", "the list would be larger");
  expect_render_error("{% set s = 'x' * 15000000 %}{{ s }}{{ s }}", "the rendered text would be larger");
}

TEST(ChatTemplateLimits, LoopsAndRangesAreBounded) {
  expect_render_error("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
                      "more than the limit of 1000000 loop iterations");
  expect_render_error("{{ range(100001) | length }}", "range() of more than the limit of 100000 items");
  expect_render_error("{{ range(-9223372036854775807, 9223372036854775807) | length }}", "limit of 100000");
  EXPECT_EQ(render("{{ range(9223372036854775806, 9223372036854775807, 5) | list }}"), "[9223372036854775806]");
  EXPECT_EQ(render("{{ range(10, 0, -3) | list }}"), "[10, 7, 4, 1]");
  EXPECT_EQ(render("{{ [1, 2, 3][::9223372036854775807] }}"), "[1]");
}

TEST(ChatTemplateLimits, CopyingLargeValuesInALoopIsBounded) {
  // Within every other limit, yet each lookup copies 1 MB: 100,000 of them would take minutes.
  expect_render_error("{% set s = 'x' * 1000000 %}{% for i in range(100000) %}{% if s %}{% endif %}{% endfor %}",
                      "more than the limit of 4 GiB of values");
}

TEST(ChatTemplateLimits, IntegerOverflowIsRefused) {
  const std::string kMax = "9223372036854775807", kMin = "(-9223372036854775807 - 1)";
  expect_render_error("{{ " + kMax + " + 1 }}", "integer overflow: 9223372036854775807 + 1");
  expect_render_error("{{ " + kMin + " - 1 }}", "integer overflow: -9223372036854775808 - 1");
  expect_render_error("{{ 4611686018427387904 * 2 }}", "integer overflow");
  expect_render_error("{{ " + kMin + " // -1 }}", "integer overflow");
  expect_render_error("{{ 2 ** 63 }}", "integer overflow: 2 ** 63");
  expect_render_error("{{ 3 ** 9223372036854775807 }}", "integer overflow");
  expect_render_error("{{ -" + kMin + " }}", "integer overflow: -(-9223372036854775808)");
  expect_render_error("{{ " + kMin + " | abs }}", "integer overflow: abs");
  expect_render_error("{{ (10.0 ** 300) | int }}", "outside the 64-bit range");
  expect_render_error("{{ '99999999999999999999' | int }}", "outside the 64-bit range");
  expect_render_error("{{ 1 // 0 }}", "division by zero");
  expect_render_error("{{ 0 ** -1 }}", "negative power");
  // In range the results are Python's.
  EXPECT_EQ(render("{{ 2 ** 62 }} {{ (-2) ** 63 }} {{ 2 ** -1 }} {{ 1 ** 9223372036854775807 }}"),
            "4611686018427387904 -9223372036854775808 0.5 1");
  EXPECT_EQ(render("{{ 7 // -2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 % -3 }} {{ " + kMin + " % -1 }}"),
            "-4 -4 2 -2 0");
  EXPECT_EQ(render("{{ " + kMax + " - 1 + 1 }} {{ -" + kMax + " }} {{ -5 | abs }}"),
            kMax + " -" + kMax + " 5");
}

TEST(ChatTemplateLimits, TojsonIndentIsBounded) {
  expect_render_error("{{ 1 | tojson(indent=100000000000) }}", "over the limit of 1024");
  EXPECT_EQ(render("{{ [1] | tojson(indent=-1) }}"), "[\n1\n]");  // Python: newlines only
  EXPECT_EQ(render("{{ [1] | tojson(indent=2) }}"), "[\n  1\n]");
}

TEST(ChatTemplateLimits, ConfigWithADeepTemplateNamesTheFile) {
  const auto path = std::filesystem::temp_directory_path() /
                    ("chat_template_test_" + std::to_string(::getpid()) + "_tokenizer_config.json");
  {
    OJ cfg = {{"chat_template", repeat("{% if true %}", 1000) + repeat("{% endif %}", 1000)}};
    std::ofstream(path) << cfg.dump();
  }
  expect_error([&] { ChatPrompt::load(path); }, path.string() + ": field chat_template: chat template line 1: blocks");
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace moestream
