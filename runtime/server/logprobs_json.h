// OpenAI's `logprobs` objects from the tokens a job reports (Job::Update::tokens): chat's
// {"content": [{token, logprob, bytes, top_logprobs}]} and the legacy completions' {tokens,
// token_logprobs, top_logprobs, text_offset}, whole or one streamed chunk at a time.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/server/job.h"
#include "runtime/tokenizer/tokenizer.h"

namespace moestream {

class LogprobsJson {
 public:
  // tok null (a model without a tokenizer): tokens are named "token_id:N", as vLLM does.
  LogprobsJson(const Tokenizer* tok, bool chat) : tok_(tok), chat_(chat) {}
  // The object for these tokens; text_offset goes on from the previous call's tokens.
  nlohmann::json next(const std::vector<SampledToken>& tokens);

 private:
  std::string token_text(int id) const;
  nlohmann::json chat_entry(int id, float logprob) const;

  const Tokenizer* tok_;
  bool chat_;
  size_t text_offset_ = 0;
};

}  // namespace moestream
