// POST /tokenize and /detokenize: text (or chat messages rendered by the template) to token ids
// and back, with the served model's tokenizer (vLLM's request and response shapes).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "runtime/chat/chat_prompt.h"
#include "runtime/tokenizer/tokenizer.h"

namespace moestream {

struct TokenizeContext {
  const Tokenizer* tok = nullptr;    // null: both endpoints answer 400 no_tokenizer
  const ChatPrompt* chat = nullptr;  // null: messages answer 400 no_chat_template
  std::string model_id;
  int max_context = 0;
  int vocab_size = 0;
};

// {"prompt": text, "add_special_tokens"?: true} or {"messages": [...], "tools"?, "chat_template_kwargs"?,
// "add_generation_prompt"?: true} -> {"tokens": [...], "count": n, "max_model_len": context}.
// Throws ApiError (400 naming the field, 404 for another model).
nlohmann::json tokenize_reply(const std::string& body, const TokenizeContext& ctx);
// {"tokens": [ids]} -> {"prompt": text} (special tokens kept, so it tokenizes back to the ids).
nlohmann::json detokenize_reply(const std::string& body, const TokenizeContext& ctx);

}  // namespace moestream
