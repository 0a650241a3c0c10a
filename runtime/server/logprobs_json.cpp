// Implementation of runtime/server/logprobs_json.h.
#include "runtime/server/logprobs_json.h"

#include <cmath>

namespace moestream {

namespace {
// JSON has no -inf: OpenAI reports a token the model rules out as -9999.
double finite(float logprob) { return std::isfinite(logprob) ? double(logprob) : -9999.0; }
}  // namespace

// The token's own text (a piece of a UTF-8 character comes out as U+FFFD); special tokens shown.
std::string LogprobsJson::token_text(int id) const {
  if (!tok_) return "token_id:" + std::to_string(id);
  const int32_t one[1] = {id};
  return tok_->decode(one, /*skip_special_tokens=*/false);
}

nlohmann::json LogprobsJson::chat_entry(int id, float logprob) const {
  const std::string t = token_text(id);
  return nlohmann::json{{"token", t}, {"logprob", finite(logprob)},
                        {"bytes", std::vector<unsigned char>(t.begin(), t.end())}};
}

nlohmann::json LogprobsJson::next(const std::vector<SampledToken>& tokens) {
  using json = nlohmann::json;
  if (chat_) {
    json content = json::array();
    for (const SampledToken& s : tokens) {
      json e = chat_entry(s.id, s.lp.logprob);
      e["top_logprobs"] = json::array();
      for (const TopLogprob& t : s.lp.top) e["top_logprobs"].push_back(chat_entry(t.id, t.logprob));
      content.push_back(std::move(e));
    }
    return json{{"content", std::move(content)}, {"refusal", nullptr}};
  }
  json out{{"tokens", json::array()}, {"token_logprobs", json::array()}, {"top_logprobs", json::array()},
           {"text_offset", json::array()}};
  for (const SampledToken& s : tokens) {
    const std::string t = token_text(s.id);
    out["tokens"].push_back(t);
    out["token_logprobs"].push_back(finite(s.lp.logprob));
    json top = json::object();
    for (const TopLogprob& x : s.lp.top)  // two tokens of one text: the likelier one's figure
      if (const std::string k = token_text(x.id); !top.contains(k)) top[k] = finite(x.logprob);
    out["top_logprobs"].push_back(std::move(top));
    out["text_offset"].push_back(text_offset_);
    text_offset_ += t.size();
  }
  return out;
}

}  // namespace moestream
