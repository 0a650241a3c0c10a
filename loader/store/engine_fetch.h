// Parts of the engine expert store (loader/store/engine_expert_store.cpp) that need none of its
// threads: what an expert read is (Piece), a layer's files (Layer), an expert of a fetch (Item),
// a fetch's buffers and read queue (Fetch), the look-ahead's rules on them (issue 19: which
// guessed experts a demand fetch takes over, the recall count), and the store's description.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "common/mapped_file.h"
#include "loader/format/expert_layer_file.h"
#include "loader/format/gguf_model.h"
#include "loader/io/io_engine.h"
#include "loader/io/residency.h"
#include "loader/store/cache_policy.h"
#include "loader/store/expert_buffer.h"
#include "loader/store/expert_store.h"
#include "loader/store/pending_checks.h"
#include "loader/store/verified_pages.h"
#include "loader/store/host_cache.h"

namespace moestream::engine_store {

// One read of an expert: `length` bytes at offset + slot*stride of `file`, landing at
// dest_offset in the expert's payload. A pack expert is one piece, a GGUF expert three.
struct Piece {
  uint32_t file = 0;
  uint64_t offset = 0, stride = 0, length = 0, dest_offset = 0;
  const PageCacheResidency* page_cache = nullptr;  // null for O_DIRECT files
  uint64_t at(uint32_t slot) const { return offset + uint64_t{slot} * stride; }
};
// A layer's experts. A pack layer keeps its file header (checksums, map); a GGUF layer has an
// empty checksum table and an identity map.
struct Layer : ExpertLayerFile {
  ExpertLayout layout;
  std::vector<Piece> pieces;
  int verified = -1;  // VerifiedPages index: a checksummed pack layer read through the page cache
  bool checksummed() const { return !header.slot_checksums.empty(); }
};

// The whole-file mappings (null entries skipped), as ExpertStore::mapped_regions hands them out.
std::vector<ExpertStore::MappedRegion> regions_of(const std::vector<std::unique_ptr<MappedFile>>& maps);

// Whether the experts of L may be handed out as mapped pages: every piece's file is buffered
// (mapped in `maps`). Where a checksum is due, only experts whose resident pages were verified
// (verified_pages.h) go in place; a GGUF has none.
bool in_place_allowed(const Layer& L, const std::vector<std::unique_ptr<MappedFile>>& maps);

// Whether every piece of the expert in `slot` is in the page cache (sampled).
bool in_page_cache(const Layer& L, uint32_t slot);
// The matrices of the expert in `slot` in the mapped files `maps` (per engine file; FormatError
// when a slice lies outside its file: offsets come from the file). A pack's expert is one piece at
// the layout's offsets, a GGUF's three pieces in gate, up, down order.
ExpertMatrices mapped_matrices(const Layer& L, int layer, uint32_t slot,
                               const std::vector<std::unique_ptr<MappedFile>>& maps);

// The MoE layers of a GGUF: each expert is slices of its layer's three expert tensors (and
// gpt-oss's three bias tensors, into the payload's bias section), possibly in different shards;
// files[s] is shard s's engine file, page_caches its residency probe (null for O_DIRECT).
std::vector<Layer> gguf_layers(const GgufModel& g, const ModelConfig& cfg, std::span<const uint32_t> files,
                               const std::vector<std::unique_ptr<PageCacheResidency>>& page_caches);

struct Item {
  uint32_t slot = 0;               // physical slot in the layer file
  int expert = 0;                  // logical id (the host cache's key)
  const uint8_t* data = nullptr;   // where the payload is (or lands)
  int64_t cache_slot = -1;         // host cache slot, or -1 (scratch buffer)
  size_t scratch = 0;
  uint32_t pieces_left = 0;        // reads still to land
  bool ready = false;
  bool mapped = false;             // handed out in place: in_place, not data
  ExpertMatrices in_place;
  bool awaited = false;            // a demand item whose bytes a look-ahead is still reading
  // Look-ahead items: taken by the demand fetch; its item waiting for this one (or -1); the read
  // or checksum failed (never handed out).
  bool taken = false, failed = false;
  int32_t awaited_by = -1;
};

// One fetch: the current one (handed out by next_ready), a read-ahead of the next group, or a
// look-ahead of a predicted layer; each reads into its own buffers while the current payloads
// are in use.
struct Fetch {
  int layer = 0;
  bool matrices = false;                 // begin_fetch_matrices: resident experts in place
  std::vector<int> ids;                  // as asked (a read-ahead is adopted on an exact match)
  std::vector<Item> items;
  std::vector<uint32_t> position_item;   // ids position -> item
  std::vector<size_t> ready;             // positions ready to hand out
  size_t ready_head = 0, handed = 0;
  std::vector<ReadRequest> reqs;         // the misses' reads (read by the I/O thread)
  std::vector<uint32_t> req_item;        // request -> item
  std::vector<uint64_t> checksum;        // request -> XXH64 computed where it landed
  std::vector<uint8_t> due;              // request -> its checksum is to be verified
  std::vector<int> pinned;               // cache slots this fetch hands out
  std::vector<uint8_t> reread;           // item -> resident but still loading elsewhere
  std::vector<size_t> first_use;         // items hashed in place (resident, never verified)
  ExpertBuffer scratch;                  // misses the cache does not take
  // Look-ahead (prefetch_predicted): this fetch is one; or the one whose reads it awaits.
  bool prediction = false;
  std::vector<int> predicted;  // the whole guess, resident experts included (recall)
  Fetch* awaits = nullptr;
  bool in_use = false;         // started and not released (or retired: still landing)
  bool retired = false;        // released while its reads were in flight: finished later
  // Shared with the I/O thread, under the store's mutex.
  std::vector<size_t> landed;  // request indices in landing order
  size_t landed_head = 0;
  bool busy = false;           // its batch is queued or in flight
  bool submitted = false;      // an I/O thread took its batch
};

// Item `it` handed out as the mapping's pages `m` (counted in place, and as a page-cache hit
// when `count_hit`).
void hand_out_in_place(Item& it, const ExpertMatrices& m, bool count_hit, ExpertStoreStats& stats);

// The first uses in f.first_use (resident experts never verified). Without `post`: each hashed
// from its mapped pages (on pf's threads when set), then marked in `verified` and handed out in
// place where it matches its slot's checksum; one that does not stays for the read path, whose
// checksum then names it. Counts verified_in_place and checksum_seconds. With `post` (deferred
// checks): each is handed out in place at once and its hash queued in `pending` (unless one is
// pending already); settle_pending checks them.
void verify_in_place(Fetch& f, const Layer& L, int layer, const std::vector<std::unique_ptr<MappedFile>>& maps,
                     VerifiedPages& verified, const ExpertStore::ParallelFor& pf, PendingChecks& pending,
                     const ExpertStore::Post& post, bool count_page_cache_hits, ExpertStoreStats& stats);

// Waits for the deferred hashes in `pending`, marks those that match in `verified` (counted in
// verified_in_place; their time in checksum_seconds) and throws the checksum FormatError of the
// first that does not (ExpertStore::verify_pending). checksum_seconds is written under stats_mu
// (the I/O threads add theirs).
void settle_pending(PendingChecks& pending, const std::vector<Layer>& layers, VerifiedPages& verified,
                    ExpertStoreStats& stats, std::mutex& stats_mu);

// Every position of `ids` that names item k becomes ready.
void push_ready(Fetch& f, size_t k);

// Whether fetch f (in use, of `layer`) holds expert `id`.
bool holds(const Fetch* f, int layer, int id);

// Demand fetch f takes from the look-ahead it awaits (f.awaits, same layer) every expert that one
// read successfully or is still reading: landed ones are ready now, the others are marked
// awaited (and the guess's item points back at them). With a host cache, the demand heats each
// taken key as it would have without the guess. Counts lookahead_used / lookahead_awaited.
void take_predicted(Fetch& f, CachePolicy* policy, ExpertStoreStats& stats);

// One line on how the store reads (ExpertStore::describe): backend after any fallback, O_DIRECT,
// read sizes, host cache, GGUF or unchecked packs.
std::string describe(const IoEngine& engine, const HostCache* cache, bool gguf, bool verify_checksums);

// Recall of guess p against the ids a demand fetch of its layer asks for (distinct ids).
void count_recall(const Fetch& p, std::span<const int> ids, ExpertStoreStats& stats);

}  // namespace moestream::engine_store
