// A fetch of the engine expert store (loader/store/engine_expert_store.cpp): an expert of it
// (Item), its buffers and reads (Fetch), the ids it was asked for mapped to its items, and the
// look-ahead's rules on fetches (issue 19: which guessed experts a demand fetch takes over, the
// recall count).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "loader/format/expert_file.h"
#include "loader/io/io_engine.h"
#include "loader/store/expert_buffer.h"
#include "loader/store/expert_layers.h"
#include "loader/store/host_cache.h"
#include "loader/store/expert_store.h"

namespace moestream::engine_store {

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
  PayloadHash hash = PayloadHash::kXxh3;  // the layer's checksums, for the I/O threads
  uint64_t payload_bytes = 0;             // the layer's payload size
  bool matrices = false;                 // FetchForm::kMatrices: resident experts in place
  std::vector<int> ids;                  // as asked (a read-ahead is adopted on an exact match)
  std::vector<Item> items;
  std::vector<uint32_t> position_item;   // ids position -> item
  std::vector<uint32_t> slots;           // the items' slots (plan's, kept for its capacity)
  std::vector<size_t> ready;             // positions ready to hand out
  size_t ready_head = 0, handed = 0;
  std::vector<ReadRequest> reqs;         // the misses' reads (read by the I/O thread)
  std::vector<uint32_t> req_item;        // request -> item
  std::vector<uint64_t> checksum;        // request -> XXH64 computed where it landed
  std::vector<uint8_t> due;              // request -> its checksum is to be verified
  std::vector<uint8_t> reread;           // item -> resident but still loading elsewhere
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

// Sets up idle fetch f for `ids` of layer L: one item per distinct physical slot, in file order,
// nothing ready yet.
void plan(Fetch& f, const Layer& L, std::span<const int> ids, bool matrices);

// Item `it` handed out as the mapping's pages `m` (counted in place, and as a page-cache hit
// when `count_hit`).
void hand_out_in_place(Item& it, const ExpertMatrices& m, bool count_hit, ExpertStoreStats& stats);

// Every position of `ids` that names item k becomes ready.
void push_ready(Fetch& f, size_t k);

// Whether fetch f (in use, of `layer`) holds expert `id`.
bool holds(const Fetch* f, int layer, int id);

// Demand fetch f takes from the look-ahead it awaits (f.awaits, same layer) every expert that one
// read successfully or is still reading: landed ones are ready now, the others are marked
// awaited (and the guess's item points back at them). With a host cache, the demand heats each
// taken key as it would have without the guess. Counts lookahead_used / lookahead_awaited.
void take_predicted(Fetch& f, HostCache* cache, ExpertStoreStats& stats);

// The tier of every logical expert of L (out.size() must be its n_experts; ExpertStore::residency):
// the host cache, else the page cache (sampled), else storage.
void tiers(const Layer& L, const HostCache* cache, std::span<ExpertTier> out);

// One line on how the store reads (ExpertStore::describe): backend after any fallback, O_DIRECT,
// read sizes, host cache, GGUF or unchecked packs.
std::string describe(const IoEngine& engine, const HostCache* cache, bool gguf, bool verify_checksums);

// Recall of guess p against the ids a demand fetch of its layer asks for (distinct ids).
void count_recall(const Fetch& p, std::span<const int> ids, ExpertStoreStats& stats);

}  // namespace moestream::engine_store
