// Tokenizer::load: reads tokenizer.json into the pipeline objects and tokenizer_config.json
// (bos/eos, Llama-style add_bos/add_eos, chat template), validating every field it uses.
#include <algorithm>

#include "common/error.h"
#include "common/file_util.h"
#include "runtime/tokenizer/tokenizer_impl.h"

namespace moestream {

namespace fs = std::filesystem;
using tok::index_path;
using tok::join_path;
using tok::Json;
using tok::JsonFields;

namespace {

constexpr int64_t kMaxId = (1 << 24) - 1;

Json parse_json_file(const fs::path& path) {
  std::string text = read_file(path);
  try {
    return Json::parse(text);
  } catch (const Json::parse_error& e) {
    throw FormatError(path.string() + ": invalid JSON at byte " + std::to_string(e.byte) + ": " +
                      e.what());
  } catch (const Json::exception& e) {  // e.g. a number too large for any type
    throw FormatError(path.string() + ": invalid JSON: " + e.what());
  }
}

void load_added_tokens(const Json& root, const JsonFields& f, Tokenizer::Impl& im) {
  const Json* list = f.find(root, "added_tokens", "");
  if (!list) return;
  f.expect_array(*list, "added_tokens");
  for (size_t i = 0; i < list->size(); ++i) {
    std::string p = index_path("added_tokens", i);
    const Json& t = (*list)[i];
    tok::AddedToken a;
    a.id = static_cast<int32_t>(f.integer(f.at(t, "id", p), join_path(p, "id"), 0, kMaxId));
    a.content = f.str(f.at(t, "content", p), join_path(p, "content"));
    if (a.content.empty()) f.bad(join_path(p, "content"), "empty added token");
    a.single_word = f.bool_or(t, "single_word", p, false);
    a.lstrip = f.bool_or(t, "lstrip", p, false);
    a.rstrip = f.bool_or(t, "rstrip", p, false);
    a.special = f.bool_or(t, "special", p, false);
    a.normalized = f.bool_or(t, "normalized", p, !a.special);
    // The reference gives a token that is also a vocabulary entry the vocabulary's id; an id
    // that belongs to a different vocabulary entry is a corrupt file.
    if (auto vid = im.model->token_to_id(a.content)) {
      a.id = *vid;
    } else if (const std::string* other = im.model->id_to_token(a.id)) {
      f.bad(join_path(p, "id"), std::to_string(a.id) + " is already the id of vocabulary token '" +
                                    *other + "'");
    }
    im.added_by_id[a.id] = im.added.size();
    im.added_by_content[a.content] = a.id;
    im.added.push_back(std::move(a));
  }
  im.build_added_matchers();
}

// bos_token / eos_token: a string, {"content": ...} or null.
std::optional<std::string> special_name(const Json& cfg, const char* key, const JsonFields& f) {
  const Json* v = f.find(cfg, key, "");
  if (!v) return std::nullopt;
  if (v->is_string()) return v->get<std::string>();
  if (v->is_object()) return f.str(f.at(*v, "content", key), join_path(key, "content"));
  f.bad(key, "expected a string, an object with \"content\", or null");
}

void load_config(const fs::path& path, Tokenizer::Impl& im) {
  Json cfg = parse_json_file(path);
  JsonFields f(path.string());
  f.expect_object(cfg, "(root)");
  auto resolve = [&](const char* key) -> std::optional<int32_t> {
    auto name = special_name(cfg, key, f);
    if (!name) return std::nullopt;
    auto id = im.token_to_id(*name);
    if (!id) f.bad(key, "token '" + *name + "' is not in the vocabulary of " + im.source);
    return id;
  };
  im.bos_id = resolve("bos_token");
  im.eos_id = resolve("eos_token");

  if (const Json* ct = f.find(cfg, "chat_template", "")) {
    if (ct->is_string()) {
      im.chat_template = ct->get<std::string>();
    } else if (ct->is_array()) {
      // A list of named templates: take "default", else the first.
      for (size_t i = 0; i < ct->size(); ++i) {
        std::string p = index_path("chat_template", i);
        const Json& e = (*ct)[i];
        std::string name = f.str(f.at(e, "name", p), join_path(p, "name"));
        std::string tpl = f.str(f.at(e, "template", p), join_path(p, "template"));
        if (i == 0 || name == "default") im.chat_template = tpl;
        if (name == "default") break;
      }
    } else {
      f.bad("chat_template", "expected a string or a list of {name, template}");
    }
  }

  // transformers' Llama/Gemma fast tokenizers rebuild the post-processor from add_bos_token /
  // add_eos_token (defaults true / false); follow them so ids match what transformers feeds the
  // model even when tokenizer.json's template disagrees.
  std::string cls = f.str_or(cfg, "tokenizer_class", "", "");
  static const char* kRebuilders[] = {"LlamaTokenizer", "LlamaTokenizerFast", "CodeLlamaTokenizer",
                                      "CodeLlamaTokenizerFast", "GemmaTokenizer",
                                      "GemmaTokenizerFast"};
  if (std::find(std::begin(kRebuilders), std::end(kRebuilders), cls) != std::end(kRebuilders)) {
    bool add_bos = f.bool_or(cfg, "add_bos_token", "", true);
    bool add_eos = f.bool_or(cfg, "add_eos_token", "", false);
    if ((add_bos && !im.bos_id) || (add_eos && !im.eos_id)) {
      f.bad(add_bos && !im.bos_id ? "add_bos_token" : "add_eos_token",
            "set but the corresponding bos_token/eos_token is missing");
    }
    im.post_processor.prefix.clear();
    im.post_processor.suffix.clear();
    if (add_bos) im.post_processor.prefix.push_back(*im.bos_id);
    if (add_eos) im.post_processor.suffix.push_back(*im.eos_id);
  }
}

std::unique_ptr<Tokenizer::Impl> load_tokenizer_json(const fs::path& path) {
  Json root = parse_json_file(path);
  JsonFields f(path.string());
  f.expect_object(root, "(root)");
  auto im = std::make_unique<Tokenizer::Impl>();
  im->source = path.string();

  if (const Json* n = f.find(root, "normalizer", "")) {
    im->normalizer = tok::make_normalizer(*n, f, "normalizer");
  }
  if (const Json* p = f.find(root, "pre_tokenizer", "")) {
    im->pre_tokenizer = tok::make_pre_tokenizer(*p, f, "pre_tokenizer");
  }
  const Json& model = f.at(root, "model", "");
  f.expect_object(model, "model");
  std::string type = model.contains("type") ? f.type_of(model, "model") : "";
  if (type.empty() && !model.contains("merges")) f.bad("model.type", "missing");
  if (!type.empty() && type != "BPE") {
    f.unsupported("model.type", "unsupported model '" + type + "' (supported: BPE)");
  }
  im->model = std::make_unique<tok::BpeModel>(model, f, "model");
  if (im->pre_tokenizer) {
    if (tok::ByteLevelPre* bl = im->pre_tokenizer->trailing_byte_level()) {
      bl->defer_mapping();
      im->model->set_byte_level_input(true);
    }
  }
  if (const Json* pp = f.find(root, "post_processor", "")) {
    im->post_processor = tok::make_post_processor(*pp, f, "post_processor");
  }
  if (const Json* d = f.find(root, "decoder", "")) {
    im->decoder = tok::make_token_decoder(*d, f, "decoder");
  }
  load_added_tokens(root, f, *im);

  int32_t limit = im->model->id_limit();
  for (const auto& a : im->added) limit = std::max(limit, a.id + 1);
  for (int32_t id : im->post_processor.prefix) {
    if (!im->id_to_token(id)) f.bad("post_processor", "special id " + std::to_string(id) + " is not in the vocabulary");
  }
  for (int32_t id : im->post_processor.suffix) {
    if (!im->id_to_token(id)) f.bad("post_processor", "special id " + std::to_string(id) + " is not in the vocabulary");
  }
  im->vocab_size = limit;
  return im;
}

}  // namespace

// The reference lists special tokens before the others when building its matchers.
void Tokenizer::Impl::build_added_matchers() {
  std::vector<const tok::AddedToken*> raw, normalized;
  std::vector<std::string> raw_pat, norm_pat;
  for (int pass = 0; pass < 2; ++pass) {
    for (const auto& a : added) {
      if (a.special != (pass == 0)) continue;
      if (a.normalized) {
        normalized.push_back(&a);
        std::string out;
        norm_pat.push_back(normalizer && normalizer->normalize(a.content, out) ? out : a.content);
      } else {
        raw.push_back(&a);
        raw_pat.push_back(a.content);
      }
    }
  }
  raw_matcher.build(raw, raw_pat);
  normalized_matcher.build(normalized, norm_pat);
}

Tokenizer Tokenizer::load(const fs::path& tokenizer_json, const fs::path& tokenizer_config) {
  std::unique_ptr<Impl> im;
  fs::path config = tokenizer_config;
  try {
    im = load_tokenizer_json(tokenizer_json);
    if (config.empty()) {
      fs::path beside = tokenizer_json.parent_path() / "tokenizer_config.json";
      if (fs::exists(beside)) config = beside;
    }
    if (!config.empty()) load_config(config, *im);
  } catch (const Json::exception& e) {
    // Any JSON access the field helpers did not anticipate still names the file.
    throw FormatError((config.empty() ? tokenizer_json : config).string() + ": " + e.what());
  }
  if (im->chat_template.empty()) {
    fs::path jinja = tokenizer_json.parent_path() / "chat_template.jinja";
    if (fs::exists(jinja)) im->chat_template = read_file(jinja);
  }
  return Tokenizer(std::move(im));
}

}  // namespace moestream
