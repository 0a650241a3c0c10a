// Implementation of runtime/grammar/tool_call_constraint.h: builds the structural tag (xgrammar's
// JSON format of composed output pieces) for the chosen calls.
#include "runtime/grammar/tool_call_constraint.h"

namespace moestream {

namespace {
using OJ = nlohmann::ordered_json;

OJ hermes_call(const std::string& name, const OJ& parameters) {
  // The name as the template writes it: a JSON string.
  return OJ{{"type", "tag"},
            {"begin", "<tool_call>\n{\"name\": " + OJ(name).dump() + ", \"arguments\": "},
            // Whitespace between JSON tokens at most one character at a time: unbounded, a small
            // model can spend max_tokens on newlines.
            {"content", {{"type", "json_schema"}, {"json_schema", parameters}, {"max_whitespace_cnt", 1}}},
            {"end", "}\n</tool_call>"}};
}
}  // namespace

ConstraintSpec tool_call_constraint(ToolCallMarkup markup, const OJ& tools, const ToolCallChoice& choice) {
  if (!tools.is_array() || tools.empty()) throw ConstraintError("needs a non-empty tools list");
  OJ calls = OJ::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string at = "tools[" + std::to_string(i) + "]";
    const OJ& t = tools[i];
    if (!t.is_object() || t.value("type", "") != "function" || !t.contains("function") || !t["function"].is_object())
      throw ConstraintError(at + " is not {\"type\": \"function\", \"function\": {...}}");
    const OJ& f = t["function"];
    if (!f.contains("name") || !f["name"].is_string()) throw ConstraintError(at + ".function.name must be a string");
    const std::string name = f["name"].get<std::string>();
    if (!choice.name.empty() && name != choice.name) continue;
    // No parameters: any JSON object (the arguments are an object in every format).
    OJ params = f.contains("parameters") && !f["parameters"].is_null() ? f["parameters"] : OJ{{"type", "object"}};
    if (!params.is_object()) throw ConstraintError(at + ".function.parameters must be a JSON Schema object");
    switch (markup) {
      case ToolCallMarkup::kHermes: calls.push_back(hermes_call(name, params)); break;
    }
  }
  if (calls.empty()) throw ConstraintError("names function '" + choice.name + "', which is not among the tools");
  const OJ body{{"type", "tags_with_separator"}, {"tags", calls}, {"separator", "\n"},
                {"at_least_one", true}, {"stop_after_first", !choice.parallel || !choice.name.empty()}};
  OJ format = body;
  if (choice.thinking)
    format = OJ{{"type", "or"},
                {"elements", OJ::array({OJ{{"type", "sequence"},
                                           {"elements", OJ::array({OJ{{"type", "tag"}, {"begin", "<think>"},
                                                                      {"content", {{"type", "any_text"}}},
                                                                      {"end", "</think>"}},
                                                                   OJ{{"type", "const_string"}, {"value", "\n\n"}},
                                                                   body})}},
                                        body})}};
  return ConstraintSpec{ConstraintSpec::Kind::kStructuralTag,
                        OJ{{"type", "structural_tag"}, {"format", format}}.dump(), true};
}

}  // namespace moestream
