// Post-processors reduced to what a single sequence needs: the ids around it.
#include "runtime/tokenizer/post_processor.h"

#include "common/error.h"

namespace moestream::tok {

namespace {

constexpr int64_t kMaxId = (1 << 24) - 1;

void template_single(const Json& j, const JsonFields& f, const std::string& path,
                     PostProcessor& pp) {
  std::string sp = join_path(path, "single");
  const Json& single = f.at(j, "single", path);
  f.expect_array(single, sp);
  const Json& specials = f.at(j, "special_tokens", path);
  std::string tp = join_path(path, "special_tokens");
  f.expect_object(specials, tp);
  bool seen_sequence = false;
  for (size_t i = 0; i < single.size(); ++i) {
    std::string ip = index_path(sp, i);
    const Json& item = single[i];
    f.expect_object(item, ip);
    if (const Json* seq = f.find(item, "Sequence", ip)) {
      std::string id = f.str(f.at(*seq, "id", join_path(ip, "Sequence")),
                             join_path(ip, "Sequence.id"));
      if (id != "A") f.unsupported(join_path(ip, "Sequence.id"), "single template must use A");
      if (seen_sequence) f.unsupported(ip, "sequence A appears twice");
      seen_sequence = true;
    } else if (const Json* st = f.find(item, "SpecialToken", ip)) {
      std::string sp2 = join_path(ip, "SpecialToken");
      std::string name = f.str(f.at(*st, "id", sp2), join_path(sp2, "id"));
      auto it = specials.find(name);
      if (it == specials.end()) f.bad(sp2, "special token '" + name + "' not in special_tokens");
      std::string np = tp + "[\"" + name + "\"]";
      const Json& ids = f.at(*it, "ids", np);
      f.expect_array(ids, join_path(np, "ids"));
      for (size_t k = 0; k < ids.size(); ++k) {
        auto id = static_cast<int32_t>(f.integer(ids[k], index_path(join_path(np, "ids"), k), 0, kMaxId));
        (seen_sequence ? pp.suffix : pp.prefix).push_back(id);
      }
    } else {
      f.bad(ip, "expected {\"Sequence\": ...} or {\"SpecialToken\": ...}");
    }
  }
  if (!seen_sequence) f.bad(sp, "template has no sequence A");
}

int32_t pair_id(const Json& j, const JsonFields& f, const char* key, const std::string& path) {
  const Json& p = f.at(j, key, path);
  std::string kp = join_path(path, key);
  f.expect_array(p, kp);
  if (p.size() != 2) f.bad(kp, "expected [token, id]");
  return static_cast<int32_t>(f.integer(p[1], index_path(kp, 1), 0, kMaxId));
}

void build(const Json& j, const JsonFields& f, const std::string& path, PostProcessor& pp) {
  std::string type = f.type_of(j, path);
  if (type == "ByteLevel") return;  // offsets only
  if (type == "TemplateProcessing") {
    PostProcessor t;
    template_single(j, f, path, t);
    pp.prefix.insert(pp.prefix.begin(), t.prefix.begin(), t.prefix.end());
    pp.suffix.insert(pp.suffix.end(), t.suffix.begin(), t.suffix.end());
    return;
  }
  if (type == "RobertaProcessing" || type == "BertProcessing") {
    pp.prefix.insert(pp.prefix.begin(), pair_id(j, f, "cls", path));
    pp.suffix.push_back(pair_id(j, f, "sep", path));
    return;
  }
  if (type == "Sequence") {
    f.for_each_in(j, "processors", path,
                  [&](const Json& step, const std::string& sp) { build(step, f, sp, pp); });
    return;
  }
  f.unsupported_type(path, "post_processor", type,
                     "TemplateProcessing, ByteLevel, RobertaProcessing, BertProcessing, Sequence");
}

}  // namespace

PostProcessor make_post_processor(const Json& j, const JsonFields& f, const std::string& path) {
  PostProcessor pp;
  build(j, f, path, pp);
  return pp;
}

}  // namespace moestream::tok
