// `render_chat_template`: prints a chat template rendered by our interpreter for a JSON context
// read from stdin ({"messages": [...], "add_generation_prompt": bool, ...}); used by the tests.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <iostream>
#include <iterator>
#include <string>

#include "common/error.h"
#include "common/file_util.h"
#include "runtime/chat/chat_prompt.h"

using namespace moestream;

int main(int argc, char** argv) {
  CLI::App app{"render a tokenizer_config.json chat template for a JSON context on stdin"};
  std::string config, template_file;
  app.add_option("--config", config, "tokenizer_config.json with chat_template and special tokens");
  app.add_option("--template", template_file, "a bare Jinja template file instead");
  CLI11_PARSE(app, argc, argv);
  try {
    if (config.empty() == template_file.empty()) throw ConfigError("give exactly one of --config, --template");
    const std::string input{std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>()};
    nlohmann::ordered_json ctx;
    try {
      ctx = nlohmann::ordered_json::parse(input);
    } catch (const nlohmann::json::exception& e) {
      throw FormatError(std::string("stdin: not valid JSON: ") + e.what());
    }
    if (!ctx.is_object() || !ctx.contains("messages")) throw FormatError("stdin: expected an object with \"messages\"");
    if (ctx.contains("add_generation_prompt") && !ctx["add_generation_prompt"].is_boolean())
      throw FormatError("stdin: add_generation_prompt must be true or false");
    // Before the copy below: copying JSON recurses, so a hostile depth is refused first.
    for (auto it = ctx.begin(); it != ctx.end(); ++it) check_template_input(it.value(), it.key());
    ChatPrompt p = config.empty() ? ChatPrompt(read_file(template_file)) : ChatPrompt::load(config);
    nlohmann::ordered_json extra = ctx;
    extra.erase("messages");
    extra.erase("add_generation_prompt");
    extra.erase("tools");
    const std::string out = p.render(ctx["messages"], ctx.value("add_generation_prompt", false),
                                     ctx.contains("tools") ? ctx["tools"] : nlohmann::ordered_json(nullptr), extra);
    std::fwrite(out.data(), 1, out.size(), stdout);
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "render_chat_template: error: %s\n", e.what());
    return 1;
  }
}
