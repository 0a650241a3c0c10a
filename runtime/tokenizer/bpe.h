// The BPE model of tokenizer.json: vocab, merges by rank, unk/byte-fallback handling and a
// per-word result cache, merging exactly in the reference's (rank, position) order.
#pragma once

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "runtime/tokenizer/json_fields.h"

namespace moestream::tok {

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};
using StringIdMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

// Open-addressing map from a packed id pair to (rank, merged id): the hot lookup of BPE.
class MergeTable {
 public:
  void reserve(size_t n);
  // Later duplicates overwrite earlier ones, as the reference's HashMap collect does.
  void insert(int32_t a, int32_t b, uint32_t rank, int32_t merged);
  // Returns false when (a, b) is not a merge.
  bool find(int32_t a, int32_t b, uint32_t& rank, int32_t& merged) const {
    if (slots_.empty()) return false;
    uint64_t key = pack(a, b);
    size_t i = hash(key) & mask_;
    while (true) {
      const Slot& s = slots_[i];
      if (s.key == key) {
        rank = s.rank;
        merged = s.merged;
        return true;
      }
      if (s.key == kEmpty) return false;
      i = (i + 1) & mask_;
    }
  }

 private:
  static constexpr uint64_t kEmpty = ~0ull;
  struct Slot {
    uint64_t key = kEmpty;
    uint32_t rank = 0;
    int32_t merged = 0;
  };
  static uint64_t pack(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  static size_t hash(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    return static_cast<size_t>(k);
  }
  std::vector<Slot> slots_;
  size_t mask_ = 0, size_ = 0;
};

class BpeModel {
 public:
  // Reads tokenizer.json "model" (type BPE). `max_id` bounds accepted ids.
  BpeModel(const Json& model, const JsonFields& f, const std::string& path);

  // The same model from plain data (a GGUF vocabulary): `tokens[id]` is the string of `id` where
  // `present[id]`; a string held by several ids maps back to the last of them (llama.cpp's rule).
  // Merges are added afterwards with reserve_merges() and add_merge().
  struct Options {
    std::optional<int32_t> unk_id;
    bool fuse_unk = false, byte_fallback = false, ignore_merges = false;
  };
  BpeModel(std::vector<std::string> tokens, std::vector<bool> present, const Options& options);
  // Sizes the merge table for `n` merges; call once, before add_merge().
  void reserve_merges(size_t n) { merges_.reserve(n); }
  // (left, right) -> merged, lowest rank first; ranks may repeat (equal ranks merge leftmost
  // first). Re-adding a pair overwrites it.
  void add_merge(int32_t left, int32_t right, uint32_t rank, int32_t merged) {
    merges_.insert(left, right, rank, merged);
  }

  BpeModel(const BpeModel&) = delete;
  BpeModel& operator=(const BpeModel&) = delete;

  // Words arrive as raw bytes; the model applies GPT-2's byte->char map itself (so the cache is
  // keyed by raw bytes and the mapping runs only on cache misses).
  void set_byte_level_input(bool on);

  // Takes the word cache for one encode call; not owned when another thread holds it.
  std::unique_lock<std::mutex> lock_cache() const {
    return std::unique_lock<std::mutex>(cache_mutex_, std::try_to_lock);
  }
  // Appends the ids of one pre-tokenized word; `cache` is a lock from lock_cache().
  void tokenize(std::string_view word, std::vector<int32_t>& out,
                const std::unique_lock<std::mutex>& cache) const;

  std::optional<int32_t> token_to_id(std::string_view token) const;
  // nullptr when `id` is not in the vocabulary.
  const std::string* id_to_token(int32_t id) const;
  // One past the largest vocabulary id.
  int32_t id_limit() const { return static_cast<int32_t>(id_to_token_.size()); }

 private:
  struct Symbol {
    int32_t id;
    int32_t prev, next;
    uint32_t len;  // bytes; 0 marks a symbol merged into its left neighbour
  };
  static std::vector<Symbol>& symbol_buffer();  // per-thread scratch
  // Builds the lookup tables derived from the vocabulary (char_ids_, byte_fallback_ids_, ...).
  void index_vocab();
  // tokenize() for one piece that is not split further.
  void tokenize_piece(std::string_view word, std::vector<int32_t>& out,
                      const std::unique_lock<std::mutex>& cache) const;
  // Builds the initial symbols of `word` char by char, then merges.
  void merge_word(std::string_view word, std::vector<int32_t>& out) const;
  // Merges symbol_buffer() by rank and appends the surviving ids.
  void merge_symbols(std::vector<int32_t>& out) const;

  StringIdMap vocab_;
  std::vector<std::string> id_to_token_;
  std::vector<bool> id_present_;
  MergeTable merges_;
  std::optional<int32_t> unk_id_;
  std::string continuing_subword_prefix_, end_of_word_suffix_;
  bool fuse_unk_ = false, byte_fallback_ = false, ignore_merges_ = false;
  bool byte_level_input_ = false;
  // Byte-level input whose 256 byte chars are all in the vocabulary, with no subword prefix or
  // suffix and no ignore_merges: initial symbols come straight from byte_ids_.
  bool byte_symbols_ = false;
  std::vector<int32_t> byte_ids_;
  // Ids of single-character tokens by code point (BMP only; -1 = not a token): initial symbols
  // without hashing strings. Empty when a subword prefix/suffix makes symbols more than a char.
  std::vector<int32_t> char_ids_;
  // SentencePiece vocabularies with no pre-tokenizer hand BPE whole sentences. When no token
  // has "▁" right after another character, no merge can cross the point before such a "▁", so
  // words are cut there (same ids, proven at load) and the pieces become cacheable.
  bool split_before_metaspace_ = false;
  std::vector<int32_t> byte_fallback_ids_;  // "<0xNN>" ids, -1 when absent

  // Word -> ids cache. Guarded by try_lock: a thread that finds it busy just skips the cache,
  // so concurrent encodes never wait on each other.
  struct CacheEntry {
    uint32_t offset, count;
  };
  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, CacheEntry, StringHash, std::equal_to<>> cache_;
  mutable std::vector<int32_t> cache_ids_;
};

}  // namespace moestream::tok
