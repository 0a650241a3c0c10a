// Chat-template macros, strftime_now and the message preparation transformers does, with the
// limits that keep macros from exhausting the stack, time or memory. The expected strings are
// jinja2's renderings (transformers' environment) of the same templates.
#include <gtest/gtest.h>

#include <ctime>
#include <string>

#include "runtime/chat/chat_prompt.h"
#include "runtime/chat/chat_template.h"
#include "tests/support/chat_render.h"

namespace moestream {
namespace {

using OJ = nlohmann::ordered_json;
using namespace test;  // render, expect_error, expect_render_error, repeat

TEST(ChatMacro, PositionalKeywordAndDefaultArguments) {
  // A default may use the parameters before it; a missing argument is undefined.
  EXPECT_EQ(render("{% macro m(a, b=2, c=a~'!') %}[{{a}}|{{b}}|{{c}}]{% endmacro %}"
                   "{{ m(1) }}{{ m(1, 3) }}{{ m(c='x', a=0) }}{{ m() }}"),
            "[1|2|1!][1|3|1!][0|2|x][|2|!]");
}

TEST(ChatMacro, VarargsAndKwargsOnlyWhenTheBodyReadsThem) {
  EXPECT_EQ(render("{% macro v(a) %}{{ a }}:{{ varargs|join(',') }}:{{ kwargs.k }}{% endmacro %}{{ v(1, 2, 3, k=4) }}"),
            "1:2,3:4");
  expect_render_error("{% macro m(a) %}{{ a }}{% endmacro %}{{ m(1, 2) }}", "takes not more than 1 argument(s)");
  expect_render_error("{% macro m(a) %}{{ a }}{% endmacro %}{{ m(b=1) }}", "takes no keyword argument 'b'");
  expect_render_error("{% macro m(a) %}{{ a }}{% endmacro %}{{ m(1, a=2) }}", "multiple values for argument 'a'");
  expect_error([] { ChatTemplate t("{% macro m(a=1, b) %}{% endmacro %}"); }, "non-default argument follows default");
  expect_error([] { ChatTemplate t("{% macro m(a) %}x"); }, "missing '{% endmacro %}'");
}

TEST(ChatMacro, SeesTheTopLevelButNotTheCallersLocals) {
  // g is a top-level set, who a context variable, i the caller's loop variable (undefined
  // inside); a set inside the macro stays inside.
  EXPECT_EQ(render("{% set g = 'G' %}{% macro s() %}{{ g }}{{ who }}{{ i }}{% set g = 'L' %}{{ g }}{% endmacro %}"
                   "{% for i in [1] %}{{ s() }}{% endfor %}{{ g }}",
                   {{"who", "W"}}),
            "GWLG");
}

TEST(ChatMacro, RecursionAndOutputInExpressions) {
  const OJ tree = {{"name", "a"},
                   {"kids", OJ::array({{{"name", "b"}}, {{"name", "c"}, {"kids", OJ::array({{{"name", "d"}}})}}})}};
  EXPECT_EQ(render("{% macro tree(n) %}{{ n.name }}{% if n.kids %}({% for k in n.kids %}{{ tree(k) }}"
                   "{{ ',' if not loop.last }}{% endfor %}){% endif %}{% endmacro %}{{ tree(t) }}",
                   {{"t", tree}}),
            "a(b,c(d))");
  EXPECT_EQ(render("{% macro m() %}ab{% endmacro %}{{ m()|length }} {{ m() == 'ab' }} {{ m().endswith('b') }} "
                   "{{ m is callable }} {{ m }} {{ m() ~ m() }}"),
            "2 True True True <Macro 'm'> abab");
  EXPECT_EQ(render("{% macro m(x) -%}\n  {{ x }}\n{%- endmacro %}\n<{{ m(1) }}>\n"), "<1>");
}

TEST(ChatMacro, InputCannotForgeAMacro) {
  // A macro is a JSON binary value, which no JSON text produces: a dict from the input is no macro.
  expect_render_error("{{ m() }}", "unknown function 'm'", {{"m", {{"__macro__", 0}}}});
  expect_render_error("{% macro m() %}{% endmacro %}{{ m | tojson }}", "not JSON serializable");
}

TEST(ChatMacroLimits, RecursionDepthIsBounded) {
  expect_render_error("{% macro m(n) %}{{ m(n + 1) }}{% endmacro %}{{ m(0) }}",
                      "macro calls nest deeper than the limit of 50 levels");
  // Each level also nests blocks and expressions near their limits: still an error, no crash.
  const std::string deep = "{% macro m(n) %}" + repeat("{% if true %}", 60) + "{{ " + repeat("(", 100) +
                           "m(n + 1)" + repeat(")", 100) + " }}" + repeat("{% endif %}", 60) +
                           "{% endmacro %}{{ m(0) }}";
  expect_render_error(deep, "limit of 50 levels");
}

TEST(ChatMacroLimits, CallCountAndOutputAreBounded) {
  // Two calls per level: 2^40 calls within the depth limit, refused by the call count.
  expect_render_error("{% macro m(n) %}{% if n > 0 %}{{ m(n - 1) }}{{ m(n - 1) }}{% endif %}{% endmacro %}{{ m(40) }}",
                      "limit of 1000000 macro calls");
  // Output doubling per level: refused by the value size limit.
  expect_render_error("{% macro m(n) %}{% if n > 0 %}{% set s = m(n - 1) %}{{ s ~ s }}{% else %}{{ 'x' * 1000000 }}"
                      "{% endif %}{% endmacro %}{{ m(30) }}",
                      "limit of 16 MiB");
}

TEST(ChatTemplateSource, NewlinesAsJinjaLexesThem) {
  // \r\n and \r become \n; one newline at the end of the source is dropped.
  EXPECT_EQ(render("a\r\nb\r\n"), "a\nb");
  EXPECT_EQ(render("a\rb\n\n"), "a\nb\n");
  EXPECT_EQ(render("{{ 'x\r\ny' }}\r\n"), "x\ny");
  EXPECT_EQ(render("a{% if 1 %}\r\nb{% endif %}\r\n"), "ab");
}

TEST(ChatStrftimeNow, FormatsTheLocalDate) {
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  ASSERT_NE(localtime_r(&now, &local), nullptr);
  const std::string year = std::to_string(1900 + local.tm_year);
  const std::string got = render("{{ strftime_now('%Y') }}");
  // Around New Year the year may change between the two clock reads.
  EXPECT_TRUE(got == year || got == std::to_string(1900 + local.tm_year + 1)) << got;
  expect_render_error("{{ strftime_now(1) }}", "strftime_now() needs one string argument");
  expect_render_error("{{ strftime_now('" + std::string(300, 'Y') + "') }}", "limit of 256 bytes");
}

TEST(ChatFilters, ItemsOfANonMappingFails) {
  EXPECT_EQ(render("{% for k, v in d|items %}{{ k }}={{ v }}{% endfor %}{{ u|items|length }}", {{"d", {{"a", 1}}}}),
            "a=10");
  expect_render_error("{{ 'abc'|items }}", "Can only get item pairs from a mapping.");
}

TEST(ChatPromptMessages, PreparedAsApplyChatTemplateDoes) {
  // Null-valued keys are dropped; reasoning is aliased to thinking (first) and reasoning_content.
  ChatPrompt p("{{ messages | tojson }}|{{ documents is none }}");
  const OJ messages = OJ::parse(R"([{"role": "assistant", "content": null, "reasoning_content": "r"},
                                    {"role": "user", "content": "u", "reasoning": "q"}])");
  EXPECT_EQ(p.render(messages, false),
            R"([{"thinking": "r", "role": "assistant", "reasoning_content": "r"}, )"
            R"({"thinking": "q", "role": "user", "content": "u", "reasoning": "q", "reasoning_content": "q"}]|True)");
}

}  // namespace
}  // namespace moestream
