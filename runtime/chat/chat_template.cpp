// ChatTemplate: the public face of the Jinja-subset interpreter (jinja_parser.cpp parses,
// jinja_eval.cpp renders).
#include "runtime/chat/chat_template.h"

#include "runtime/chat/jinja_ast.h"
#include "runtime/chat/jinja_value.h"

namespace moestream {

void check_template_input(const nlohmann::ordered_json& value, const std::string& name) {
  if (jinja::nests_deeper(value, kMaxTemplateValueDepth))
    throw ChatTemplateError("chat template input '" + name + "' nests deeper than the limit of " +
                            std::to_string(kMaxTemplateValueDepth) + " levels of lists and objects");
}

ChatTemplate::ChatTemplate(const std::string& source)
    : tpl_(std::make_unique<jinja::Template>(jinja::parse(source))) {}
ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;
ChatTemplate& ChatTemplate::operator=(ChatTemplate&&) noexcept = default;
ChatTemplate::~ChatTemplate() = default;

std::string ChatTemplate::render(const nlohmann::ordered_json& context) const {
  return jinja::render(*tpl_, context);
}

}  // namespace moestream
