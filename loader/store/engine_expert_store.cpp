// ExpertStore over the read engine, put together from its parts: where experts are
// (expert_layers.h: logical id -> physical slot -> reads), the host cache (host_cache.h: hits at
// once, keyed by logical id), in-place page-cache use (in_place_use.h), checksum trust
// (checksum_trust.h), request building (read_plan.h) and the I/O threads (fetch_queue.h). Misses
// are read in one coalesced batch and handed out as each one lands; a read-ahead reads the next
// fetch's misses into a second set of buffers; a look-ahead reads a predicted layer's misses on a
// lane of its own, and that layer's fetch takes them (landed or in flight) instead of reading
// them again. This file holds the fetches' life cycle: which buffers a fetch uses, what it
// takes over, how a landed read is judged and what a finished fetch gives back.
#include "loader/store/engine_expert_store.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "common/error.h"
#include "loader/store/checksum_trust.h"
#include "loader/store/engine_fetch.h"
#include "loader/store/expert_layers.h"
#include "loader/store/fetch_queue.h"
#include "loader/store/host_cache.h"
#include "loader/store/in_place_use.h"
#include "loader/store/read_plan.h"

namespace moestream {
namespace {

using engine_store::Fetch;
using engine_store::Item;
using engine_store::Layer;

// Three engine lanes: the current fetch and a read-ahead, and the look-ahead's own, so a demand
// batch never waits for a lane behind a guess.
IoEngineOptions store_lanes(IoEngineOptions o) {
  o.max_batches_in_flight = std::max(3u, o.max_batches_in_flight);
  return o;
}

// Reading whole 4 KiB pages keeps O_DIRECT reads in place, and when the file's slot stride is
// the same, neighbouring slots read into neighbouring buffers form one contiguous read. Every
// buffer (scratch, host-cache slot) holds the largest expert of any layer.
uint64_t read_bytes_of(const ModelConfig& cfg) {
  return (cfg.max_expert_bytes() + kExpertAlign - 1) / kExpertAlign * kExpertAlign;
}

class EngineExpertStore final : public ExpertStore {
 public:
  EngineExpertStore(const std::filesystem::path& model_dir, const ModelConfig& cfg,
                    const EngineExpertStoreOptions& opts)
      : model_dir_(model_dir),
        cfg_(cfg),
        opts_(opts),
        engine_(store_lanes(opts.io)),
        files_(model_dir, cfg, opts.use_maps, read_bytes_of(cfg), engine_),
        cache_(opts.host_cache_bytes > 0 ? std::make_unique<HostCache>(opts.host_cache_bytes, read_bytes_of(cfg))
                                         : nullptr),
        trust_(opts.store.verify_checksums),
        in_place_(files_, trust_, engine_.backend() == IoBackend::kMmap, opts.count_page_cache_hits),
        reads_(cache_.get(), trust_, read_bytes_of(cfg), opts.count_page_cache_hits) {
    for (int l = 0; l < int(files_.n_layers()); ++l) trust_.track(files_.layer(l));
    cur_->in_use = true;  // the current fetch, empty until the first begin (never a guess's buffer)
  }

  std::vector<MappedRegion> mapped_regions() const override { return files_.regions(); }
  void set_parallel_for(ParallelFor pf) override { trust_.set_parallel_for(std::move(pf)); }
  void set_deferred_checks(Post post) override { trust_.set_deferred(std::move(post)); }
  void verify_pending() override { trust_.settle(files_.layers(), stats_); }

  std::unique_ptr<ExpertStore> reopen() const override {
    EngineExpertStoreOptions o = opts_;
    o.host_cache_bytes = 0;            // a second host cache would hold the same experts twice
    o.count_page_cache_hits = false;   // nobody reads a reopened store's tier counts
    return std::make_unique<EngineExpertStore>(model_dir_, cfg_, o);
  }

  void begin_fetch(int layer, std::span<const int> ids, FetchForm form) override {
    begin(layer, ids, form == FetchForm::kMatrices);
  }

  bool next_ready(size_t* index, ExpertMatrices* m, bool wait) override {
    const Item* it = nullptr;
    if (!next_item(index, &it, wait)) return false;
    *m = it->mapped ? it->in_place : ExpertMatrices::of_payload(it->data, files_.layer(cur_->layer).layout);
    return true;
  }

  void prefetch_predicted(int layer, std::span<const int> ids) override {
    check_layer(layer);
    reap_retired();
    if (Fetch* p = std::exchange(pred_, nullptr)) {  // an earlier guess nobody took
      queue_.cancel_if_queued(*p);
      release(*p);
    }
    ++stats_.lookahead_predictions;
    stats_.lookahead_predicted += ids.size();
    const Layer& L = files_.layer(layer);
    // Read only what no host tier holds and no fetch of this store is reading already.
    std::vector<int>& want = want_;
    want.clear();
    for (int id : ids) {
      const uint32_t slot = L.slot_of(id);
      if (std::find(want.begin(), want.end(), id) != want.end()) continue;
      if (cache_ && cache_->holds(ExpertKey{layer, id})) continue;
      if (L.in_page_cache(slot)) continue;
      if (engine_store::holds(cur_, layer, id) || engine_store::holds(next_, layer, id)) continue;
      want.push_back(id);
    }
    Fetch* f = free_fetch_or_null();
    if (f == nullptr) return;  // every buffer busy with reads still landing: no guess this time
    f->predicted.assign(ids.begin(), ids.end());
    f->prediction = true;
    start(*f, layer, want, cur_->matrices);
    pred_ = f;
  }

  void read_ahead(int layer, std::span<const int> ids) override {
    check_layer(layer);
    if (ids.empty()) return;
    if (Fetch* p = std::exchange(next_, nullptr)) release(*p);
    Fetch& f = free_fetch();
    start(f, layer, ids, cur_->matrices);  // read ahead for the same kind of caller
    next_ = &f;
  }

  void residency(int layer, std::span<ExpertTier> out) const override {
    check_layer(layer);
    engine_store::tiers(files_.layer(layer), cache_.get(), out);
  }

  std::string describe() const override {
    return engine_store::describe(engine_, cache_.get(), cfg_.format == ModelFormat::kGguf,
                                  opts_.store.verify_checksums);
  }

  ExpertStoreStats stats() const override {
    return queue_.with_counters(stats_);  // waits for batches in flight
  }

 private:
  void check_layer(int layer) const {
    MOE_ASSERT(layer >= 0 && layer < static_cast<int>(files_.n_layers()), "layer out of range");
  }

  void begin(int layer, std::span<const int> ids, bool matrices) {
    check_layer(layer);
    stats_.fetch_calls += 1;
    stats_.experts_requested += ids.size();
    reap_retired();
    // A look-ahead of this layer is taken (what it read or is reading); one of another layer is
    // discarded, as is one whose batch has not started yet (it would only queue behind).
    Fetch* pred = std::exchange(pred_, nullptr);
    if (pred != nullptr && pred->layer == layer) count_recall(*pred, ids, stats_);
    if (pred != nullptr && (queue_.cancel_if_queued(*pred) || pred->layer != layer)) {
      release(*pred);
      pred = nullptr;
    }
    if (Fetch* p = std::exchange(next_, nullptr)) {
      if (p->layer == layer && p->matrices == matrices &&
          std::equal(ids.begin(), ids.end(), p->ids.begin(), p->ids.end())) {
        release(*cur_);  // the fetch whose payloads were valid until now
        cur_ = p;
        ++stats_.fetches_read_ahead;
        if (pred != nullptr) release(*pred);
        return;
      }
      release(*p);  // a read-ahead nobody asked for
    }
    release(*cur_);
    Fetch& f = free_fetch();
    if (pred != nullptr) drain(*pred);  // what landed meanwhile is checked and ready to take
    f.awaits = pred;
    start(f, layer, ids, matrices);
    cur_ = &f;
  }

  // Sets up fetch `f` (idle) for `ids`: host-cache hits ready at once (and pinned, so that
  // placing the misses cannot evict an expert of this fetch), then for a caller of matrices what
  // the page cache holds in place, then the misses' reads queued. A look-ahead (f.prediction)
  // reads all of `ids` as speculative fills on its own thread; a demand fetch first takes what
  // the look-ahead it awaits read or is reading.
  void start(Fetch& f, int layer, std::span<const int> ids, bool matrices) {
    const Layer& L = files_.layer(layer);
    engine_store::plan(f, L, ids, matrices);
    if (f.awaits != nullptr) take_predicted(f, cache_.get(), stats_);
    if (cache_ && !f.prediction)
      for (size_t k = 0; k < f.items.size(); ++k) {
        Item& it = f.items[k];
        if (it.ready || it.awaited) continue;
        const int64_t cs = cache_->take_hit(ExpertKey{layer, it.expert});
        f.reread[k] = cs == HostCache::kLoading;
        if (cs < 0) continue;
        it.data = cache_->slot_data(uint32_t(cs));
        it.cache_slot = cs;
        it.ready = true;
        ++stats_.host_cache_hits;
      }
    const engine_store::ChecksumTrust::LayerTrust t = trust_.begin(L);
    in_place_.place(f, L, t, stats_);
    reads_.build(f, L, t, stats_);
    if (!f.reqs.empty()) queue_.submit(f);
  }

  // The next ready expert of the current fetch (its position in ids and its item).
  bool next_item(size_t* index, const Item** item, bool wait) {
    Fetch& f = *cur_;
    Fetch* const p = f.awaits;  // a look-ahead whose reads some of f's experts wait for
    while (f.ready_head == f.ready.size()) {
      if (f.handed >= f.ids.size()) return false;
      size_t r;
      bool mine;
      if (!queue_.next_landed(f, p, wait, &mine, &r)) return false;
      // A failed read fails the pass: its first uses' hashes vouch for no later one, and the
      // fetch hands out nothing more (asked again, it neither waits for what will not come).
      try {
        trust_.abandon_if_throws([&] { mine ? land(f, r) : land_prediction(*p, r, &f); });
      } catch (const Error&) {
        f.ready_head = f.ready.size();
        f.handed = f.ids.size();
        throw;
      }
    }
    const size_t pos = f.ready[f.ready_head++];
    *index = pos;
    *item = &f.items[f.position_item[pos]];
    ++f.handed;
    return true;
  }

  // A read landed: check its outcome and the checksum the I/O worker computed (here, on the
  // caller's thread, so errors throw where the caller can catch them), then release its expert.
  void land(Fetch& f, size_t r) {
    const ReadRequest& q = f.reqs[r];
    const size_t k = f.req_item[r];
    Item& it = f.items[k];
    const Layer& L = files_.layer(f.layer);
    if (q.result != ReadResult::kOk) throw engine_store::read_error(engine_, q);
    if (--it.pieces_left > 0) return;  // the expert's other slices are still in flight
    if (f.due[r] && f.checksum[r] != L.header.slot_checksums[it.slot])
      throw expert_checksum_error(L, it.slot, L.layout.bytes, f.checksum[r]);
    // Read through the page cache and verified: those pages may be used again unhashed.
    if (f.due[r]) trust_.passed(L, it.slot);
    if (it.cache_slot >= 0) cache_->proved(it.cache_slot);
    it.ready = true;
    push_ready(f, k);
  }

  // A look-ahead read landed: checked as any read (land), but a failure only marks the guess
  // failed, unless the demand fetch waits for that expert: then it throws there as a demand read
  // of it would. A good one releases the demand item waiting for it.
  void land_prediction(Fetch& p, size_t r, Fetch* demand) {
    Item& it = p.items[p.req_item[r]];
    if (it.failed) return;
    try {
      land(p, r);
    } catch (const Error&) {
      it.failed = true;
      if (demand != nullptr && it.awaited_by >= 0) throw;
      return;
    }
    if (!it.ready || demand == nullptr || it.awaited_by < 0) return;
    Item& d = demand->items[size_t(it.awaited_by)];
    d.ready = true;
    push_ready(*demand, size_t(it.awaited_by));
  }

  // Checks every look-ahead read of p that landed so far (caller's thread).
  void drain(Fetch& p) {
    size_t r;
    bool mine;
    while (queue_.next_landed(p, nullptr, false, &mine, &r)) land_prediction(p, r, nullptr);
  }

  // Look-aheads released while still reading are finished once their batch is done.
  void reap_retired() {
    for (Fetch& f : fetches_)
      if (f.retired && !queue_.busy(f)) finish(f);
  }

  // Waits out fetch f's batch and gives back its host-cache slots, forgetting those whose data
  // never proved good (failed read, bad checksum, a fetch abandoned after an error, or a
  // read-ahead that was never used: its reads may not have been checked). A look-ahead still
  // reading is retired instead (finished later by reap_retired), so that a demand fetch never
  // waits for a guess's reads; its slots stay pinned until then.
  void release(Fetch& f) {
    if (Fetch* p = std::exchange(f.awaits, nullptr)) release(*p);
    if (f.prediction && queue_.retire_if_busy(f)) return;
    finish(f);
  }
  void finish(Fetch& f) {
    queue_.wait_done(f);
    if (f.prediction) {
      drain(f);  // landed guesses are checked, so good ones stay in the host cache
      if (f.submitted)
        for (const Item& it : f.items) stats_.lookahead_wasted += !it.taken;
    }
    if (cache_)
      for (const Item& it : f.items)
        if (it.cache_slot >= 0) cache_->release(ExpertKey{f.layer, it.expert}, it.cache_slot);
    f.items.clear();
    f.ids.clear();
    f.predicted.clear();
    f.prediction = f.retired = f.in_use = f.submitted = false;
    f.ready.clear();
    f.ready_head = f.handed = 0;
    f.reqs.clear();
  }

  Fetch* free_fetch_or_null() {
    for (Fetch& f : fetches_)
      if (!f.in_use) return &f;
    return nullptr;
  }
  // A buffer for a fetch; when look-aheads still landing hold them all, waits for the first.
  Fetch& free_fetch() {
    if (Fetch* f = free_fetch_or_null()) return *f;
    for (Fetch& f : fetches_)
      if (f.retired) {
        finish(f);
        return f;
      }
    MOE_ASSERT(false, "no free fetch buffer");
    return fetches_[0];
  }

  std::filesystem::path model_dir_;  // for reopen()
  ModelConfig cfg_;
  EngineExpertStoreOptions opts_;
  IoEngine engine_;
  engine_store::ExpertFiles files_;
  std::unique_ptr<HostCache> cache_;
  engine_store::ChecksumTrust trust_;  // after files_: its pending hashes are waited for before the unmapping
  engine_store::InPlaceUse in_place_;
  engine_store::ReadPlan reads_;
  ExpertStoreStats stats_;  // the caller's thread's counts (the I/O threads': queue_.counters())
  std::vector<int> want_;   // prefetch_predicted's experts to read

  // The current fetch, the look-ahead it awaits, a read-ahead, the next look-ahead, and room
  // for look-aheads retired while still landing.
  Fetch fetches_[6];
  Fetch* cur_ = &fetches_[0];   // handed out by next_ready (caller's thread only)
  Fetch* next_ = nullptr;       // a read-ahead in flight or landed, or null
  Fetch* pred_ = nullptr;       // a look-ahead in flight or landed, not taken yet, or null
  engine_store::FetchQueue queue_{engine_};  // last: gone (its batches done) before the buffers
};

}  // namespace

std::unique_ptr<ExpertStore> open_engine_expert_store(const std::filesystem::path& model_dir,
                                                      const ModelConfig& cfg,
                                                      const EngineExpertStoreOptions& opts) {
  return std::make_unique<EngineExpertStore>(model_dir, cfg, opts);
}

}  // namespace moestream
