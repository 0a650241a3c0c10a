// ChatTemplate: the public face of the Jinja-subset interpreter (jinja_parser.cpp parses,
// jinja_eval.cpp renders).
#include "runtime/chat/chat_template.h"

#include "runtime/chat/jinja_ast.h"

namespace moestream {

ChatTemplate::ChatTemplate(const std::string& source)
    : tpl_(std::make_unique<jinja::Template>(jinja::parse(source))) {}
ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;
ChatTemplate& ChatTemplate::operator=(ChatTemplate&&) noexcept = default;
ChatTemplate::~ChatTemplate() = default;

std::string ChatTemplate::render(const nlohmann::ordered_json& context) const {
  return jinja::render(*tpl_, context);
}

}  // namespace moestream
