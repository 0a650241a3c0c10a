// The runtime's only way to get expert weights: per layer it asks for the selected expert ids and
// receives their encoded payloads (loader/format/expert_file.h layout) or their three matrices in
// place, one by one as they land; it can also ask which experts sit in which memory tier.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/error.h"
#include "loader/format/model_config.h"
#include "loader/store/pending_checks.h"

namespace moestream {

// Where an expert's bytes are now, fastest last.
enum class ExpertTier : uint8_t {
  kStorage,    // only on disk: a fetch reads it from the device
  kPageCache,  // in the OS page cache (buffered reads): a fetch copies it, no device I/O
  kHostCache,  // in the store's own host cache (O_DIRECT mode): a fetch does no I/O at all
};

// How a caller takes the experts of a fetch (ExpertStore::begin_fetch).
enum class FetchForm : uint8_t {
  // Each expert as one contiguous payload (ExpertMatrices::payload is set): for a caller that
  // copies whole experts (the GPU cache's look-ahead worker, fetch()).
  kPayload,
  // Only the three matrices are read (the CPU pass, the GPU's staging and CPU misses): a store
  // may leave an expert whose pages are already in host memory where it is (a read-only mapping
  // of the file) instead of copying it into a payload; payload is then null.
  kMatrices,
};

// An expert's three matrices where they can be read: inside one payload (at its ExpertLayout's
// offsets) or, when a store computes in place, in the file's mapped pages (a GGUF expert's three
// slices lie in three tensors).
struct ExpertMatrices {
  const uint8_t* gate = nullptr;
  const uint8_t* up = nullptr;
  const uint8_t* down = nullptr;
  // gpt-oss: f32 gate_bias [F], up_bias [F], down_bias [D] (ExpertLayout::bias_offset); else null.
  const float* bias = nullptr;
  // A first use handed out before its hash ran (ExpertStore::set_deferred_checks): the thread
  // that computes it first runs the hash (PendingChecks::run_now). Valid until verify_pending().
  PendingChecks::Entry* unverified = nullptr;
  // The whole payload (ExpertLayout::make(quant, D, F).bytes bytes) when the expert is one; null
  // when it is handed out in place (FetchForm::kMatrices only).
  const uint8_t* payload = nullptr;
  static ExpertMatrices of_payload(const uint8_t* p, const ExpertLayout& lay) {
    return {p + lay.gate_offset, p + lay.up_offset, p + lay.down_offset,
            lay.types.bias ? reinterpret_cast<const float*>(p + lay.bias_offset) : nullptr, nullptr, p};
  }
};

struct ExpertStoreStats {
  uint64_t fetch_calls = 0;     // begin_fetch() calls (fetch() makes one)
  uint64_t experts_requested = 0;
  uint64_t experts_read = 0;    // experts that had to be read from a file
  uint64_t bytes_read = 0;      // expert payload bytes read from files
  double io_seconds = 0;        // wall time from issuing a layer's reads until the last one landed
  // Hits per tier: host_cache_hits needed no read; page_cache_hits were found in the page cache
  // just before (buffered mode, sampled with cachestat/mincore), read from there or computed in
  // place (experts_in_place) from resident pages.
  uint64_t host_cache_hits = 0;
  uint64_t page_cache_hits = 0;
  uint64_t read_ops_requested = 0;   // reads asked of the engine (one per missing expert)
  uint64_t read_ops_issued = 0;      // reads issued after coalescing neighbours and splitting
  uint64_t bytes_transferred = 0;    // bytes the reads moved, gaps read through included
  double io_wait_seconds = 0;        // time the caller blocked for experts: I/O not hidden
  double checksum_seconds = 0;       // time spent verifying checksums, summed over threads
  uint64_t fetches_read_ahead = 0;   // begin_fetch() calls whose reads a read_ahead() had started
  uint64_t experts_in_place = 0;     // handed out as mapped pages of the file, neither read nor copied
  uint64_t checksums_skipped = 0;    // copied from page-cache pages verified earlier (verified_pages.h)
  uint64_t verified_in_place = 0;    // first uses hashed from their resident pages, not read (of experts_in_place)
  // Experts handed out, read or used in place: each distinct expert of a fetch counts once.
  uint64_t experts_fetched() const { return experts_read + experts_in_place; }
  // Look-ahead of the next layer (prefetch_predicted, CPU --moe-lookahead): experts predicted;
  // of them, those not resident and read (also in experts_read/bytes_read); of those, read and
  // then taken by the demand fetch of that layer (landed, or awaited in flight) or never taken.
  uint64_t lookahead_predictions = 0;  // prefetch_predicted() calls
  uint64_t lookahead_predicted = 0;
  uint64_t lookahead_read = 0, lookahead_used = 0, lookahead_awaited = 0, lookahead_wasted = 0;
  uint64_t lookahead_cancelled = 0;  // guessed reads dropped before they started (taken too late)
  // Recall: of the distinct experts a demand fetch asked for after a prediction for its layer,
  // how many the prediction named (resident or not).
  uint64_t lookahead_demanded = 0, lookahead_demanded_predicted = 0;
  double lookahead_recall() const {
    return lookahead_demanded ? double(lookahead_demanded_predicted) / double(lookahead_demanded) : 0.0;
  }
};

// One fetch protocol: begin_fetch() starts making a layer's experts available and next_ready()
// hands them out one by one as they land (fetch() and take_ready() are the two ways of waiting
// for them, written once here). The rest are hints that never change what a fetch hands out
// (read_ahead: the exact next fetch, adopted whole; prefetch_predicted: a guess at another
// layer, taken expert by expert and never evicting), questions (residency, stats, describe,
// mapped_regions), a second store for a second thread (reopen), and the caller's threads lent
// for checksums (set_parallel_for, set_deferred_checks / verify_pending).
class ExpertStore {
 public:
  virtual ~ExpertStore() = default;

  // Starts making logical experts `ids` of `layer` available and returns; experts already in
  // host memory are ready at once, the others as their reads land. Experts handed out stay valid
  // until the next begin_fetch(). With FetchForm::kMatrices a store may hand out experts in place.
  virtual void begin_fetch(int layer, std::span<const int> ids, FetchForm form = FetchForm::kPayload) = 0;
  // Hands out one more expert of the last begin_fetch(): true with its position in `ids` and its
  // matrices (and payload, FetchForm). With `wait`, blocks until one is ready and returns false
  // only once every one was handed out; without, returns false when none is ready right now.
  // Throws IoError / FormatError (checksum) naming file and offset for a failed expert.
  virtual bool next_ready(size_t* index, ExpertMatrices* m, bool wait = true) = 0;

  // Every expert of `ids` as its payload: out[i] points to the payload of ids[i], valid until the
  // next begin_fetch()/fetch(). Same errors as next_ready.
  void fetch(int layer, std::span<const int> ids, std::vector<const uint8_t*>& out) {
    begin_fetch(layer, ids, FetchForm::kPayload);
    out.assign(ids.size(), nullptr);
    size_t i = 0;
    ExpertMatrices m;
    while (next_ready(&i, &m, true)) out[i] = m.payload;
  }
  // The experts that landed together: waits for one of the current fetch's, then takes every
  // other one ready by then; each one goes to experts[index] and its index is appended to
  // `ready` (cleared first). A compute loop calls it until it has every expert it asked for.
  void take_ready(std::vector<ExpertMatrices>& experts, std::vector<int>& ready) {
    ready.clear();
    size_t i = 0;
    ExpertMatrices m;
    for (bool wait = true; next_ready(&i, &m, wait); wait = false) {
      experts[i] = m;
      ready.push_back(int(i));
    }
    MOE_ASSERT(!ready.empty(), "expert store handed out fewer experts than asked");
  }

  // Read-ahead: starts reading the experts that the next begin_fetch() will ask for (prefill: the
  // next group of the same layer's experts, known exactly; not the GPU cache's look-ahead, which
  // predicts the next layer's), while the current fetch's payloads stay valid and are still
  // handed out; a following begin_fetch() with the same layer and ids finds them landed or in
  // flight, any other begin_fetch() discards them. The default does nothing.
  virtual void read_ahead(int layer, std::span<const int> ids) {
    (void)layer;
    (void)ids;
  }

  // Look-ahead (issue 19): `ids` are a guess at the experts the next begin_fetch() of `layer` will
  // ask for (another layer's, predicted during the current one). Starts reading those that are in
  // no host tier, on a lane of their own, while the current fetch's payloads stay valid and
  // pinned (a prediction never evicts them). The begin_fetch() of `layer` takes what landed and
  // awaits what is still in flight rather than reading it twice, and reads only the rest; a
  // begin_fetch() of another layer, or a later prediction, discards it. Never changes a payload.
  // The default does nothing.
  virtual void prefetch_predicted(int layer, std::span<const int> ids) {
    (void)layer;
    (void)ids;
  }

  // The tier of every logical expert of `layer` (out.size() must be n_experts), cheap enough to
  // ask per layer per token (a hash lookup per expert, plus a sampled page-cache probe for
  // buffered reads). The default knows nothing and says kStorage.
  virtual void residency(int layer, std::span<ExpertTier> out) const {
    (void)layer;
    for (ExpertTier& t : out) t = ExpertTier::kStorage;
  }

  virtual ExpertStoreStats stats() const = 0;

  // A second, independent store over the same files with the same read options but no host
  // cache of its own, for a thread that reads beside this store's user (a store is not
  // thread-safe; the GPU cache's look-ahead worker). nullptr when this store cannot reopen itself.
  virtual std::unique_ptr<ExpertStore> reopen() const { return nullptr; }

  // One line on how experts are read (backend after any fallback, O_DIRECT, host cache), for
  // --timing and --stats-json.
  virtual std::string describe() const { return "one pread per expert"; }

  // The read-only mappings of the files next_ready() hands out pages of (FetchForm::kMatrices, buffered
  // reads; none for O_DIRECT files or a store that never computes in place). They live as long
  // as the store. The GPU cache may page-lock them (--gpu-pin-page-cache).
  struct MappedRegion {
    std::filesystem::path path;
    const uint8_t* data;
    uint64_t size;
  };
  virtual std::vector<MappedRegion> mapped_regions() const { return {}; }

  // Runs fn(0) .. fn(n - 1), possibly in parallel, and returns when all are done: the caller's
  // threads, lent to the store for work it would otherwise do on one (the engine store hashes
  // experts whose resident pages it verifies in place). Called only from the thread that calls
  // begin_fetch*, outside any of the lender's parallel sections. Unset: the store's own threads.
  using ParallelFor = std::function<void(size_t n, const std::function<void(size_t)>& fn)>;
  virtual void set_parallel_for(ParallelFor pf) { (void)pf; }

  // Deferred first-use checks (issue 19: the CPU forward pass). With `post` set, a store may hand
  // out through next_ready (FetchForm::kMatrices) an expert whose checksum is still due (a first use of
  // resident pages) before its hash ran: it queues the hash through `post` (ThreadPool::post:
  // taken by threads a parallel section leaves idle) and then the caller MUST call
  // verify_pending() before it returns anything computed from the experts handed out. Unset (the default, and every caller but the CPU
  // pass): each hash is checked before its expert is handed out. The default ignores it.
  using Post = std::function<void(std::function<void()>)>;
  virtual void set_deferred_checks(Post post) { (void)post; }
  // Waits for every deferred hash (hashing here those no thread started) and throws the
  // checksum FormatError naming file, slot and logical id of the first that does not match; the
  // ones that match count as verified (verified_in_place). Nothing to do: returns at once.
  virtual void verify_pending() {}
};

struct ExpertStoreOptions {
  bool verify_checksums = true;  // verify XXH64 of each expert on every read
};

// Reads experts with pread(2) from `model_dir/experts/layer_NNN.bin`. Validates every layer
// file's header against `cfg` on open.
std::unique_ptr<ExpertStore> open_pread_expert_store(const std::filesystem::path& model_dir,
                                                     const ModelConfig& cfg,
                                                     const ExpertStoreOptions& opts = {});

}  // namespace moestream
