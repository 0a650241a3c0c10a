// Implementation of loader/store/engine_fetch.h.
#include "loader/store/engine_fetch.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <string>

#include "common/error.h"
#include "common/timing.h"

namespace moestream::engine_store {

ExpertMatrices mapped_matrices(const Layer& L, int layer, uint32_t slot,
                               const std::vector<std::unique_ptr<MappedFile>>& maps) {
  const auto at = [&](const Piece& p, uint64_t n) {
    return maps[p.file]->range(p.at(slot), n, "expert slot " + std::to_string(slot) + " of layer " +
                                                  std::to_string(layer));
  };
  if (L.pieces.size() == 1) return ExpertMatrices::of_payload(at(L.pieces[0], L.layout.bytes), L.layout);
  MOE_ASSERT(L.pieces.size() == 3, "a GGUF expert is three slices");
  return {at(L.pieces[0], L.pieces[0].length), at(L.pieces[1], L.pieces[1].length),
          at(L.pieces[2], L.pieces[2].length)};
}

void hand_out_in_place(Item& it, const ExpertMatrices& m, bool count_hit, ExpertStoreStats& stats) {
  it.in_place = m;
  it.mapped = it.ready = true;
  ++stats.experts_in_place;
  stats.page_cache_hits += count_hit;
}

void verify_in_place(Fetch& f, const Layer& L, int layer, const std::vector<std::unique_ptr<MappedFile>>& maps,
                     VerifiedPages& verified, const ExpertStore::ParallelFor& pf, PendingChecks& pending,
                     const ExpertStore::Post& post, bool count_page_cache_hits, ExpertStoreStats& stats) {
  const size_t n = f.first_use.size();
  if (n == 0) return;
  std::vector<ExpertMatrices> ms(n);
  for (size_t i = 0; i < n; ++i) ms[i] = mapped_matrices(L, layer, f.items[f.first_use[i]].slot, maps);
  if (post) {  // computed now, checked by settle_pending before the caller returns a result
    for (size_t i = 0; i < n; ++i) {
      Item& it = f.items[f.first_use[i]];
      ms[i].unverified = pending.find(layer, it.slot);
      if (ms[i].unverified == nullptr)
        ms[i].unverified = pending.add(layer, it.slot, L.header.payload_hash, ms[i].gate - L.layout.gate_offset,
                                       L.layout.bytes, verified.epoch(L.verified), post);
      hand_out_in_place(it, ms[i], count_page_cache_hits, stats);
    }
    return;
  }
  std::vector<uint64_t> got(n, 0);
  const auto t0 = std::chrono::steady_clock::now();
  const auto hash = [&](size_t i) { got[i] = expert_checksum(L.header.payload_hash, ms[i].gate - L.layout.gate_offset, L.layout.bytes); };
  if (pf && n > 1) {
    pf(n, hash);
  } else {
    for (size_t i = 0; i < n; ++i) hash(i);
  }
  stats.checksum_seconds += seconds_since(t0);
  for (size_t i = 0; i < n; ++i) {
    Item& it = f.items[f.first_use[i]];
    if (got[i] != L.header.slot_checksums[it.slot]) continue;
    verified.mark(L.verified, it.slot);
    hand_out_in_place(it, ms[i], count_page_cache_hits, stats);
    ++stats.verified_in_place;
  }
}

void settle_pending(PendingChecks& pending, const std::vector<Layer>& layers, VerifiedPages& verified,
                    ExpertStoreStats& stats, std::mutex& stats_mu) {
  const auto settled = pending.settle();
  double seconds = 0;
  for (const auto& e : settled) seconds += e->seconds;
  {
    std::lock_guard<std::mutex> lock(stats_mu);
    stats.checksum_seconds += seconds;
  }
  const PendingChecks::Entry* bad = nullptr;
  for (const auto& e : settled) {
    const Layer& L = layers[size_t(e->layer)];
    if (e->got != L.header.slot_checksums[e->slot]) {
      if (bad == nullptr) bad = e.get();
      continue;
    }
    // Its file changed since the hash was queued: those bytes passed, but the pages may not be
    // the same now, so the expert is not marked (its next use is hashed again).
    if (verified.refresh(L.verified) && verified.epoch(L.verified) == e->epoch)
      verified.mark(L.verified, e->slot);
    ++stats.verified_in_place;
  }
  if (bad != nullptr) throw expert_checksum_error(layers[size_t(bad->layer)], bad->slot, bad->bytes, bad->got);
}

std::vector<ExpertStore::MappedRegion> regions_of(const std::vector<std::unique_ptr<MappedFile>>& maps) {
  std::vector<ExpertStore::MappedRegion> out;
  for (const auto& m : maps)
    if (m && m->size() > 0) out.push_back({m->path(), m->range(0, m->size(), "the whole file"), m->size()});
  return out;
}

bool in_place_allowed(const Layer& L, const std::vector<std::unique_ptr<MappedFile>>& maps) {
  if (L.pieces.size() > 3) return false;  // gpt-oss's GGUF biases: three slices, not one bias section
  for (const Piece& p : L.pieces)
    if (!maps[p.file]) return false;
  return true;
}

bool in_page_cache(const Layer& L, uint32_t slot) {
  for (const Piece& p : L.pieces)
    if (p.page_cache == nullptr || !p.page_cache->sample(p.at(slot), std::min(p.length, L.layout.bytes), 2).fully_resident())
      return false;
  return true;
}

std::vector<Layer> gguf_layers(const GgufModel& g, const ModelConfig& cfg, std::span<const uint32_t> files,
                               const std::vector<std::unique_ptr<PageCacheResidency>>& page_caches) {
  std::vector<Layer> layers;
  const size_t F4 = size_t(cfg.moe_intermediate_size) * sizeof(float);
  for (int l = 0; l < cfg.n_moe_layers(); ++l) {
    Layer L;
    L.path = g.files().paths().front();
    L.header.n_experts = uint32_t(cfg.n_experts);
    L.map = ExpertMap::identity(uint32_t(cfg.n_experts));
    L.layout = cfg.expert_layout(l);
    const GgufLayerExperts& x = g.experts()[size_t(l)];
    std::vector<std::pair<const GgufExpertMatrix*, size_t>> slices = {
        {&x.gate, L.layout.gate_offset}, {&x.up, L.layout.up_offset}, {&x.down, L.layout.down_offset}};
    if (x.bias)  // gpt-oss: three f32 bias slices into the payload's bias section
      slices.insert(slices.end(), {{&x.gate_bias, L.layout.bias_offset},
                                   {&x.up_bias, L.layout.bias_offset + F4},
                                   {&x.down_bias, L.layout.bias_offset + 2 * F4}});
    for (const auto& [m, dest] : slices)
      L.pieces.push_back(Piece{files[m->shard], m->offset, m->expert_bytes, m->expert_bytes, dest,
                               page_caches[files[m->shard]].get()});
    layers.push_back(std::move(L));
  }
  return layers;
}

void push_ready(Fetch& f, size_t k) {
  for (size_t i = 0; i < f.position_item.size(); ++i)
    if (f.position_item[i] == k) f.ready.push_back(i);
}

bool holds(const Fetch* f, int layer, int id) {
  if (f == nullptr || !f->in_use || f->layer != layer) return false;
  return std::any_of(f->items.begin(), f->items.end(), [&](const Item& it) { return it.expert == id; });
}

void take_predicted(Fetch& f, CachePolicy* policy, ExpertStoreStats& stats) {
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
    if (policy != nullptr) (void)policy->lookup(ExpertKey{f.layer, it.expert}, CacheFill::kDemand);
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
