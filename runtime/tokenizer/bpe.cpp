// BPE: vocab/merges loading with validation, initial symbols (with unk fusing and <0xNN> byte
// fallback), and the reference's heap-ordered merge loop, behind a per-word cache.
#include "runtime/tokenizer/bpe.h"

#include <algorithm>
#include <functional>
#include <cstdio>
#include <queue>

#include "common/error.h"
#include "runtime/tokenizer/utf8.h"

namespace moestream::tok {

namespace {
// Ids above this are treated as corruption rather than allocated for.
constexpr int64_t kMaxId = (1 << 24) - 1;
// Words longer than this are not cached (the reference uses the same bound); they are rare and
// would fill the cache with single-use entries.
constexpr size_t kMaxCachedWordBytes = 256;
// The cache is dropped when it holds this many ids, bounding memory on endless unique input.
constexpr size_t kMaxCachedIds = 8 << 20;
constexpr const char* kMetaspaceToken = "\xE2\x96\x81";
}  // namespace

void MergeTable::reserve(size_t n) {
  size_t cap = 16;
  while (cap < n * 2) cap <<= 1;
  slots_.assign(cap, Slot{});
  mask_ = cap - 1;
  size_ = 0;
}

void MergeTable::insert(int32_t a, int32_t b, uint32_t rank, int32_t merged) {
  MOE_ASSERT(!slots_.empty() && size_ * 2 < slots_.size(), "MergeTable::reserve too small");
  uint64_t key = pack(a, b);
  size_t i = hash(key) & mask_;
  while (slots_[i].key != kEmpty && slots_[i].key != key) i = (i + 1) & mask_;
  if (slots_[i].key == kEmpty) ++size_;
  slots_[i] = Slot{key, rank, merged};
}

BpeModel::BpeModel(const Json& model, const JsonFields& f, const std::string& path) {
  std::string vp = join_path(path, "vocab");
  const Json& vocab = f.at(model, "vocab", path);
  f.expect_object(vocab, vp);
  vocab_.reserve(vocab.size());
  int64_t max_id = -1;
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    int64_t id = f.integer(it.value(), vp + "[\"" + it.key() + "\"]", 0, kMaxId);
    vocab_[it.key()] = static_cast<int32_t>(id);
    max_id = std::max(max_id, id);
  }
  // Real vocabularies are dense; a far-out id is corruption, and would size the tables below.
  if (max_id >= static_cast<int64_t>(2 * vocab.size() + 1024)) {
    f.bad(vp, "id " + std::to_string(max_id) + " is far beyond the " +
                  std::to_string(vocab.size()) + " entries (ids must be dense)");
  }
  id_to_token_.resize(static_cast<size_t>(max_id + 1));
  id_present_.assign(static_cast<size_t>(max_id + 1), false);
  for (const auto& [tok, id] : vocab_) {
    id_to_token_[id] = tok;
    id_present_[id] = true;
  }

  if (const Json* d = f.find(model, "dropout", path)) {
    if (!d->is_number()) f.bad(join_path(path, "dropout"), "expected a number or null");
    if (d->get<double>() != 0.0) {
      f.unsupported(join_path(path, "dropout"), "BPE dropout is random; only null/0 is supported");
    }
  }
  if (const Json* u = f.find(model, "unk_token", path)) {
    std::string up = join_path(path, "unk_token");
    std::string unk = f.str(*u, up);
    auto id = token_to_id(unk);
    if (!id) f.bad(up, "unk_token '" + unk + "' is not in the vocabulary");
    unk_id_ = id;
  }
  continuing_subword_prefix_ = f.str_or(model, "continuing_subword_prefix", path, "");
  end_of_word_suffix_ = f.str_or(model, "end_of_word_suffix", path, "");
  fuse_unk_ = f.bool_or(model, "fuse_unk", path, false);
  byte_fallback_ = f.bool_or(model, "byte_fallback", path, false);
  ignore_merges_ = f.bool_or(model, "ignore_merges", path, false);
  index_vocab();

  std::string mp = join_path(path, "merges");
  const Json* merges = f.find(model, "merges", path);
  if (merges) f.expect_array(*merges, mp);
  merges_.reserve(merges ? merges->size() : 0);
  if (!merges) return;
  std::string a, b;
  for (size_t i = 0; i < merges->size(); ++i) {
    const Json& m = (*merges)[i];
    std::string ip = index_path(mp, i);
    if (m.is_string()) {
      const std::string& s = m.get_ref<const std::string&>();
      size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos) {
        f.bad(ip, "expected \"left right\" with exactly one space, found \"" + s + "\"");
      }
      a.assign(s, 0, sp);
      b.assign(s, sp + 1);
    } else if (m.is_array() && m.size() == 2) {
      a = f.str(m[0], index_path(ip, 0));
      b = f.str(m[1], index_path(ip, 1));
    } else {
      f.bad(ip, "expected a string or a pair of strings");
    }
    auto ia = token_to_id(a), ib = token_to_id(b);
    if (!ia) f.bad(ip, "merge token '" + a + "' is not in the vocabulary");
    if (!ib) f.bad(ip, "merge token '" + b + "' is not in the vocabulary");
    // The right part loses its continuing-subword prefix when merged.
    std::string merged = a;
    size_t plen = continuing_subword_prefix_.size();
    merged.append(b, b.compare(0, plen, continuing_subword_prefix_) == 0 ? plen : 0);
    auto im = token_to_id(merged);
    if (!im) f.bad(ip, "merged token '" + merged + "' is not in the vocabulary");
    merges_.insert(*ia, *ib, static_cast<uint32_t>(i), *im);
  }
}

BpeModel::BpeModel(std::vector<std::string> tokens, std::vector<bool> present,
                   const Options& options)
    : id_to_token_(std::move(tokens)), id_present_(std::move(present)) {
  MOE_ASSERT(id_to_token_.size() == id_present_.size() &&
                 id_to_token_.size() <= static_cast<size_t>(kMaxId) + 1,
             "BpeModel: tokens and present differ in size or exceed the id range");
  vocab_.reserve(id_to_token_.size());
  for (size_t id = 0; id < id_to_token_.size(); ++id) {
    if (id_present_[id]) vocab_[id_to_token_[id]] = static_cast<int32_t>(id);
  }
  unk_id_ = options.unk_id;
  fuse_unk_ = options.fuse_unk;
  byte_fallback_ = options.byte_fallback;
  ignore_merges_ = options.ignore_merges;
  index_vocab();
}

void BpeModel::index_vocab() {
  if (continuing_subword_prefix_.empty() && end_of_word_suffix_.empty()) {
    char_ids_.assign(0x10000, -1);
    for (const auto& [tok, id] : vocab_) {
      size_t k = 0;
      if (tok.empty()) continue;
      char32_t cp = next_code_point(tok, k);
      if (k == tok.size() && cp < char_ids_.size()) char_ids_[cp] = id;
    }
  }
  if (continuing_subword_prefix_.empty() && end_of_word_suffix_.empty() && !ignore_merges_ &&
      vocab_.count(std::string(kMetaspaceToken)) != 0) {
    split_before_metaspace_ = true;
    for (const auto& [tok, id] : vocab_) {
      for (size_t p = tok.find(kMetaspaceToken, 1); p != std::string::npos;
           p = tok.find(kMetaspaceToken, p + 3)) {
        if (p < 3 || tok.compare(p - 3, 3, kMetaspaceToken) != 0) split_before_metaspace_ = false;
      }
      if (!split_before_metaspace_) break;
    }
  }
  byte_fallback_ids_.assign(256, -1);
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    if (auto id = token_to_id(name)) byte_fallback_ids_[b] = *id;
  }
}

void BpeModel::set_byte_level_input(bool on) {
  byte_level_input_ = on;
  byte_symbols_ = false;
  if (!on || !continuing_subword_prefix_.empty() || !end_of_word_suffix_.empty() || ignore_merges_) {
    return;
  }
  const ByteLevelMap& m = byte_level_map();
  byte_ids_.assign(256, -1);
  for (int b = 0; b < 256; ++b) {
    auto id = token_to_id(m.byte_to_utf8[b]);
    if (!id) return;  // the general path handles unk / byte fallback
    byte_ids_[b] = *id;
  }
  byte_symbols_ = true;
}

std::optional<int32_t> BpeModel::token_to_id(std::string_view token) const {
  auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::id_to_token(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= id_to_token_.size() || !id_present_[id]) return nullptr;
  return &id_to_token_[id];
}

namespace {
constexpr std::string_view kMetaspace = "\xE2\x96\x81";  // U+2581
}  // namespace

void BpeModel::tokenize(std::string_view word, std::vector<int32_t>& out,
                        const std::unique_lock<std::mutex>& cache) const {
  if (!split_before_metaspace_ || byte_level_input_) {
    tokenize_piece(word, out, cache);
    return;
  }
  size_t start = 0, pos = word.find(kMetaspace, 1);
  while (pos != std::string_view::npos) {
    // Cut before a "▁" that follows another character (never inside a run of "▁").
    bool after_metaspace = pos >= 3 && word.substr(pos - 3, 3) == kMetaspace;
    if (!after_metaspace) {
      tokenize_piece(word.substr(start, pos - start), out, cache);
      start = pos;
    }
    pos = word.find(kMetaspace, pos + kMetaspace.size());
  }
  tokenize_piece(word.substr(start), out, cache);
}

void BpeModel::tokenize_piece(std::string_view word, std::vector<int32_t>& out,
                              const std::unique_lock<std::mutex>& cache) const {
  if (word.empty()) return;
  bool cacheable = cache.owns_lock() && word.size() <= kMaxCachedWordBytes;
  if (cacheable) {
    auto it = cache_.find(word);
    if (it != cache_.end()) {
      const int32_t* p = cache_ids_.data() + it->second.offset;
      out.insert(out.end(), p, p + it->second.count);
      return;
    }
  }
  size_t before = out.size();
  if (byte_symbols_) {
    // Every byte is a vocabulary symbol: skip the char map and the string lookups.
    std::vector<Symbol>& symbols = symbol_buffer();
    symbols.clear();
    for (size_t k = 0; k < word.size(); ++k) {
      auto idx = static_cast<int32_t>(k);
      symbols.push_back(Symbol{byte_ids_[static_cast<unsigned char>(word[k])], idx - 1, idx + 1, 1});
    }
    merge_symbols(out);
  } else if (byte_level_input_) {
    thread_local std::string mapped;
    mapped.clear();
    const ByteLevelMap& m = byte_level_map();
    for (char c : word) mapped.append(m.byte_to_utf8[static_cast<unsigned char>(c)]);
    merge_word(mapped, out);
  } else {
    merge_word(word, out);
  }
  if (cacheable) {
    if (cache_ids_.size() > kMaxCachedIds) {
      cache_.clear();
      cache_ids_.clear();
    }
    CacheEntry e{static_cast<uint32_t>(cache_ids_.size()), static_cast<uint32_t>(out.size() - before)};
    cache_ids_.insert(cache_ids_.end(), out.begin() + static_cast<ptrdiff_t>(before), out.end());
    cache_.emplace(std::string(word), e);
  }
}

namespace {

// A queued merge packed as rank << 32 | position, so the min-heap's order is the reference's
// (lowest rank first, leftmost among equals) with one integer compare. A rank names one merge,
// so an entry is stale exactly when the pair now at its position has another rank.
uint64_t candidate(uint32_t rank, uint32_t pos) { return (static_cast<uint64_t>(rank) << 32) | pos; }

}  // namespace

std::vector<BpeModel::Symbol>& BpeModel::symbol_buffer() {
  thread_local std::vector<Symbol> symbols;
  return symbols;
}

void BpeModel::merge_word(std::string_view word, std::vector<int32_t>& out) const {
  if (ignore_merges_) {
    if (auto id = token_to_id(word)) {
      out.push_back(*id);
      return;
    }
  }
  thread_local std::string piece;
  std::vector<Symbol>& symbols = symbol_buffer();
  symbols.clear();
  auto push = [&](int32_t id, uint32_t len) {
    int32_t idx = static_cast<int32_t>(symbols.size());
    symbols.push_back(Symbol{id, idx - 1, idx + 1, len});
  };
  // An unknown character is held back so that a run of them can fuse into one unk; as in the
  // reference, byte-fallback symbols do not flush the held one.
  int32_t pending_unk = -1;  // id, or -1 when none is held
  uint32_t pending_unk_len = 0;
  size_t i = 0;
  while (i < word.size()) {
    size_t start = i;
    i += utf8_len(static_cast<unsigned char>(word[i]));
    if (i > word.size()) i = word.size();
    std::string_view ch = word.substr(start, i - start);
    std::optional<int32_t> id;
    if (!char_ids_.empty()) {
      size_t k = 0;
      char32_t cp = next_code_point(ch, k);
      if (cp < char_ids_.size()) {
        if (char_ids_[cp] >= 0) id = char_ids_[cp];
      } else {
        id = token_to_id(ch);
      }
    } else if (continuing_subword_prefix_.empty() && end_of_word_suffix_.empty()) {
      id = token_to_id(ch);
    } else {
      piece.clear();
      if (start > 0) piece.append(continuing_subword_prefix_);
      piece.append(ch);
      if (i == word.size()) piece.append(end_of_word_suffix_);
      id = token_to_id(piece);
    }
    auto len = static_cast<uint32_t>(ch.size());
    if (id) {
      if (pending_unk >= 0) push(pending_unk, pending_unk_len);
      pending_unk = -1;
      push(*id, len);
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (char c : ch) all = all && byte_fallback_ids_[static_cast<unsigned char>(c)] >= 0;
      if (all) {
        for (char c : ch) push(byte_fallback_ids_[static_cast<unsigned char>(c)], 1);
        continue;
      }
    }
    if (unk_id_) {
      if (pending_unk >= 0 && fuse_unk_) {
        pending_unk_len += len;
      } else {
        if (pending_unk >= 0) push(pending_unk, pending_unk_len);
        pending_unk = *unk_id_;
        pending_unk_len = len;
      }
    }
    // Without an unk token the character is dropped, as the reference does.
  }
  if (pending_unk >= 0) push(pending_unk, pending_unk_len);
  merge_symbols(out);
}

void BpeModel::merge_symbols(std::vector<int32_t>& out) const {
  std::vector<Symbol>& symbols = symbol_buffer();
  if (symbols.empty()) return;
  symbols.back().next = -1;

  thread_local std::vector<uint64_t> heap;
  heap.clear();
  std::greater<uint64_t> min_first;
  uint32_t rank;
  int32_t merged;
  for (size_t k = 0; k + 1 < symbols.size(); ++k) {
    if (merges_.find(symbols[k].id, symbols[k + 1].id, rank, merged)) {
      heap.push_back(candidate(rank, static_cast<uint32_t>(k)));
    }
  }
  std::make_heap(heap.begin(), heap.end(), min_first);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), min_first);
    uint64_t top = heap.back();
    heap.pop_back();
    auto top_rank = static_cast<uint32_t>(top >> 32);
    auto top_pos = static_cast<uint32_t>(top);
    Symbol& cur = symbols[top_pos];
    if (cur.len == 0 || cur.next == -1) continue;
    int32_t next_pos = cur.next;
    Symbol right = symbols[next_pos];
    // Skip entries made stale by an earlier merge.
    if (!merges_.find(cur.id, right.id, rank, merged) || rank != top_rank) continue;
    cur.id = merged;
    cur.len += right.len;
    cur.next = right.next;
    symbols[next_pos].len = 0;
    if (right.next >= 0) symbols[right.next].prev = static_cast<int32_t>(top_pos);
    if (cur.prev >= 0) {
      if (merges_.find(symbols[cur.prev].id, cur.id, rank, merged)) {
        heap.push_back(candidate(rank, static_cast<uint32_t>(cur.prev)));
        std::push_heap(heap.begin(), heap.end(), min_first);
      }
    }
    if (cur.next >= 0) {
      if (merges_.find(cur.id, symbols[cur.next].id, rank, merged)) {
        heap.push_back(candidate(rank, top_pos));
        std::push_heap(heap.begin(), heap.end(), min_first);
      }
    }
  }
  for (const Symbol& s : symbols) {
    if (s.len != 0) out.push_back(s.id);
  }
}

}  // namespace moestream::tok
