// Implementation of runtime/tokenizer/model_tokenizer.h.
#include "runtime/tokenizer/model_tokenizer.h"

#include <algorithm>
#include <string>

#include "common/error.h"
#include "loader/format/gguf_model.h"
#include "runtime/tokenizer/gguf_vocab.h"

namespace moestream {

std::optional<Tokenizer> load_model_tokenizer(const std::filesystem::path& model, const ModelConfig& cfg) {
  std::optional<Tokenizer> tok;
  std::filesystem::path source = model;
  if (cfg.format == ModelFormat::kGguf) {
    tok.emplace(load_gguf_tokenizer(model));
  } else if (!cfg.tokenizer_file.empty() && is_gguf_file(model / cfg.tokenizer_file)) {
    // A pack converted from a GGUF keeps the GGUF's tokenizer metadata in its dense.gguf.
    source = model / cfg.tokenizer_file;
    tok.emplace(load_gguf_tokenizer(source));
  } else {
    if (cfg.tokenizer_file.empty()) return std::nullopt;
    const std::filesystem::path cfg_file =
        cfg.tokenizer_config_file.empty() ? std::filesystem::path() : model / cfg.tokenizer_config_file;
    tok.emplace(Tokenizer::load(model / cfg.tokenizer_file, cfg_file));
    source = cfg_file.empty() ? model / cfg.tokenizer_file : cfg_file;
  }
  const std::optional<int32_t> eos = tok->eos_id();
  if (!cfg.eos_token_id && eos && (*eos < 0 || *eos >= cfg.vocab_size))
    throw ConfigError(source.string() + ": eos token id " + std::to_string(*eos) +
                      " is outside the model's vocabulary [0, vocab_size=" + std::to_string(cfg.vocab_size) + ")");
  return tok;
}

std::vector<int> end_of_turn_ids(std::optional<int> model_eos, const Tokenizer* tok) {
  std::vector<int> ids;
  auto add = [&](int id) {
    if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
  };
  if (model_eos) add(*model_eos);
  if (!tok) return ids;
  if (tok->eos_id()) add(*tok->eos_id());
  for (const char* t : {"<|im_end|>", "<|endoftext|>", "</s>", "<|eot_id|>", "<|return|>", "<|call|>", "<|user|>",
                        "<|observation|>"})
    if (auto id = tok->token_id(t); id && tok->is_special(*id)) add(*id);
  return ids;
}

}  // namespace moestream
