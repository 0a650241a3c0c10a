// Implementation of loader/store/engine_fetch.h.
#include "loader/store/engine_fetch.h"

#include <algorithm>
#include <cstdio>
#include <string>

#include "common/error.h"

namespace moestream::engine_store {

void plan(Fetch& f, const Layer& L, std::span<const int> ids, bool matrices) {
  f.in_use = true;
  f.layer = L.index;
  f.hash = L.header.payload_hash;
  f.payload_bytes = L.layout.bytes;
  f.matrices = matrices;
  f.ids.assign(ids.begin(), ids.end());
  slots_in_file_order(L, ids, f.slots, f.position_item);
  f.items.assign(f.slots.size(), Item{});
  for (size_t k = 0; k < f.slots.size(); ++k) f.items[k].slot = f.slots[k];
  for (size_t i = 0; i < ids.size(); ++i) f.items[f.position_item[i]].expert = ids[i];
  f.ready.clear();
  f.ready_head = 0;
  f.handed = 0;
  f.reread.assign(f.items.size(), 0);
}

void hand_out_in_place(Item& it, const ExpertMatrices& m, bool count_hit, ExpertStoreStats& stats) {
  it.in_place = m;
  it.mapped = it.ready = true;
  ++stats.experts_in_place;
  stats.page_cache_hits += count_hit;
}

void push_ready(Fetch& f, size_t k) {
  for (size_t i = 0; i < f.position_item.size(); ++i)
    if (f.position_item[i] == k) f.ready.push_back(i);
}

bool holds(const Fetch* f, int layer, int id) {
  if (f == nullptr || !f->in_use || f->layer != layer) return false;
  return std::any_of(f->items.begin(), f->items.end(), [&](const Item& it) { return it.expert == id; });
}

void take_predicted(Fetch& f, HostCache* cache, ExpertStoreStats& stats) {
  Fetch& p = *f.awaits;
  for (size_t k = 0; k < f.items.size(); ++k) {
    Item& it = f.items[k];
    auto q = std::find_if(p.items.begin(), p.items.end(), [&](const Item& x) { return x.expert == it.expert; });
    if (q == p.items.end() || q->failed) continue;  // a failed guess: read (and checked) anew
    q->taken = true;
    ++stats.lookahead_used;
    it.data = q->data;
    if (q->ready) {
      it.ready = true;
    } else {
      it.awaited = true;
      q->awaited_by = int32_t(k);
      ++stats.lookahead_awaited;
    }
    if (cache != nullptr) cache->heat(ExpertKey{f.layer, it.expert});
  }
}

void tiers(const Layer& L, const HostCache* cache, std::span<ExpertTier> out) {
  MOE_ASSERT(out.size() == L.header.n_experts, "residency: out must hold n_experts entries");
  for (uint32_t e = 0; e < L.header.n_experts; ++e) {
    if (cache != nullptr && cache->holds(ExpertKey{L.index, int(e)}))
      out[e] = ExpertTier::kHostCache;
    else if (L.in_page_cache(L.map.physical(e)))
      out[e] = ExpertTier::kPageCache;
    else
      out[e] = ExpertTier::kStorage;
  }
}

std::string describe(const IoEngine& engine, const HostCache* cache, bool gguf, bool verify_checksums) {
  std::string s = "engine " + std::string(io_backend_name(engine.backend()));
  const IoEngineOptions& o = engine.options();
  size_t direct = 0;
  for (uint32_t f = 0; f < engine.n_files(); ++f) direct += engine.file_is_direct(f);
  s += direct == engine.n_files() ? ", O_DIRECT" : direct ? ", O_DIRECT on some files" : ", buffered";
  if (engine.backend() == IoBackend::kUring)
    s += ", " + std::to_string(o.n_rings) + " rings x QD " + std::to_string(o.queue_depth);
  else
    s += ", " + std::to_string(o.n_threads) + " threads";
  s += ", coalesce gap " + std::to_string(o.coalesce ? o.coalesce_gap_bytes >> 10 : 0) +
       " KiB, max read " + std::to_string(o.max_read_bytes >> 10) + " KiB";
  if (direct > 0 && o.direct_max_read_bytes > 0)
    s += " (O_DIRECT " + std::to_string(o.direct_max_read_bytes >> 10) + " KiB)";
  if (cache != nullptr) {
    char buf[96];
    std::snprintf(buf, sizeof buf, ", host cache %.1f MiB (%u experts)",
                  double(uint64_t(cache->n_slots()) * cache->slot_bytes()) / (1 << 20), cache->n_slots());
    s += buf;
  }
  if (gguf) s += ", GGUF (3 slices per expert, no checksums in the format)";
  else if (!verify_checksums) s += ", checksums off";
  return s;
}

void count_recall(const Fetch& p, std::span<const int> ids, ExpertStoreStats& stats) {
  for (size_t i = 0; i < ids.size(); ++i) {
    if (std::find(ids.begin(), ids.begin() + ptrdiff_t(i), ids[i]) != ids.begin() + ptrdiff_t(i)) continue;
    ++stats.lookahead_demanded;
    stats.lookahead_demanded_predicted +=
        std::find(p.predicted.begin(), p.predicted.end(), ids[i]) != p.predicted.end();
  }
}

}  // namespace moestream::engine_store
