// infer's conversation mode (--conversation, llama-cli's -cnv): user turns read line by line from
// a stream, each rendered with the model's chat template together with the turns before it; the
// KV cache keeps the conversation, so a turn runs only the tokens after the prefix it shares with
// the last (generate_continued). Ctrl-C (SIGINT) stops a reply and returns to the prompt; at the
// prompt it ends the chat, as does the end of input.
#pragma once

#include <cstdio>
#include <optional>
#include <string>

#include "runtime/chat/chat_prompt.h"
#include "runtime/engine/generate.h"
#include "runtime/model/sampler.h"
#include "runtime/tokenizer/tokenizer.h"

namespace moestream {

struct ChatSettings {
  std::string system_prompt;   // "" = none
  std::string first_message;   // "" = the first turn is read from `in` too
  int max_tokens = 0;          // per reply
  SamplerParams sampling;
  std::vector<int> end_tokens; // a reply ends after one of these (empty: --ignore-eos)
  bool timing = false;         // a line per turn on stderr: prompt tokens reused and run
};

// Runs the chat until the end of `in` or Ctrl-C at the prompt; replies go to stdout, the "> "
// prompt to stderr when `in` is a terminal. Returns the last turn's stats (nullopt: no turn).
// ConfigError when the model has no chat template or a turn does not fit the context.
std::optional<GenerateStats> run_chat(Model& model, const Tokenizer& tok, const ChatPrompt& chat,
                                      const ChatSettings& s, std::FILE* in);

}  // namespace moestream
