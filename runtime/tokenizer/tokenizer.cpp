// moestream::Tokenizer: the encode pipeline (added tokens -> normalizer -> normalized added tokens
// -> pre-tokenizer -> BPE -> post-processor) and decode (ids -> token strings -> decoder chain).
#include "runtime/tokenizer/tokenizer.h"

#include "common/error.h"
#include "runtime/tokenizer/tokenizer_impl.h"
#include "runtime/tokenizer/utf8.h"

namespace moestream {

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

namespace {

// Per-thread buffers reused across encode calls so steady-state encoding allocates nothing.
struct EncodeScratch {
  std::vector<tok::Segment> segments, normalized_segments;
  std::vector<tok::Piece> pieces;
  tok::PieceArena arena;
};

// Replaces `out` by the added tokens of `m` in `text` and the runs of text between them.
void split_added(const tok::AddedTokenMatcher& m, std::string_view text, std::vector<tok::Segment>& out) {
  out.clear();
  if (m.empty()) {
    if (!text.empty()) out.push_back({text, -1, 0});
  } else {
    m.split(text, out);
  }
}

}  // namespace

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  const Impl& im = *impl_;
  size_t bad = tok::find_invalid_utf8(text);
  if (bad != std::string_view::npos) {
    throw FormatError("tokenizer (" + im.source + "): input text is not valid UTF-8 at byte " +
                      std::to_string(bad));
  }
  thread_local EncodeScratch s;
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 8);
  auto cache = im.model->lock_cache();

  split_added(im.raw_matcher, text, s.segments);
  for (const tok::Segment& seg : s.segments) {
    if (seg.id >= 0) {
      ids.push_back(seg.id);
      continue;
    }
    std::string_view normed = seg.text;
    if (im.normalizer) {
      std::string& buf = s.arena.emplace_back();
      if (im.normalizer->normalize(seg.text, buf)) normed = buf;
    }
    split_added(im.normalized_matcher, normed, s.normalized_segments);
    for (const tok::Segment& ns : s.normalized_segments) {
      if (ns.id >= 0) {
        ids.push_back(ns.id);
        continue;
      }
      s.pieces.clear();
      s.pieces.push_back({ns.text, seg.offset == 0 && ns.offset == 0});
      if (im.pre_tokenizer) im.pre_tokenizer->apply(s.pieces, s.arena);
      for (const tok::Piece& p : s.pieces) im.model->tokenize(p.text, ids, cache);
    }
  }
  s.arena.clear();
  if (add_special_tokens) im.post_processor.apply(ids);
  return ids;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  const Impl& im = *impl_;
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    const std::string* t = im.id_to_token(id);
    if (!t) continue;
    if (skip_special_tokens && is_special(id)) continue;
    tokens.push_back(*t);
  }
  std::string out;
  if (im.decoder) {
    im.decoder->decode_chain(tokens);
    for (const auto& t : tokens) out += t;
  } else {
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (i) out.push_back(' ');
      out += tokens[i];
    }
  }
  return out;
}

int32_t Tokenizer::vocab_size() const { return impl_->vocab_size; }
std::optional<int32_t> Tokenizer::bos_id() const { return impl_->bos_id; }
std::optional<int32_t> Tokenizer::eos_id() const { return impl_->eos_id; }
const std::string& Tokenizer::chat_template() const { return impl_->chat_template; }

std::string Tokenizer::token_text(int32_t id) const {
  const std::string* t = impl_->id_to_token(id);
  if (!t) {
    throw ConfigError("tokenizer (" + impl_->source + "): token id " + std::to_string(id) +
                      " is not in the vocabulary (size " + std::to_string(impl_->vocab_size) + ")");
  }
  return *t;
}

std::optional<int32_t> Tokenizer::token_id(std::string_view token) const {
  return impl_->token_to_id(token);
}

bool Tokenizer::is_special(int32_t id) const {
  auto it = impl_->added_by_id.find(id);
  return it != impl_->added_by_id.end() && impl_->added[it->second].special;
}

VocabEncoding Tokenizer::vocab_encoding() const {
  return impl_->decoder ? impl_->decoder->encoding() : VocabEncoding::kRaw;
}

}  // namespace moestream
