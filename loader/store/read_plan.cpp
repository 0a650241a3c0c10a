// Implementation of loader/store/read_plan.h.
#include "loader/store/read_plan.h"

#include "loader/format/expert_file.h"

namespace moestream::engine_store {

void ReadPlan::build(Fetch& f, const Layer& L, ChecksumTrust::LayerTrust t, ExpertStoreStats& stats) {
  size_t n_scratch = 0;
  for (size_t k = 0; k < f.items.size(); ++k) {
    Item& it = f.items[k];
    if (it.ready || it.awaited) continue;
    if (cache_ != nullptr && !f.reread[k]) {
      // A guess fills as speculative (admission may refuse it: it then reads into scratch).
      it.cache_slot = cache_->fill(ExpertKey{f.layer, it.expert},
                                   f.prediction ? CacheFill::kSpeculative : CacheFill::kDemand);
      if (it.cache_slot >= 0) {
        it.data = cache_->slot_data(uint32_t(it.cache_slot));
        continue;
      }
    }
    it.scratch = n_scratch++;
  }
  uint8_t* const scratch = f.scratch.reserve(n_scratch, read_bytes_, kExpertAlign);
  f.reqs.clear();
  f.req_item.clear();
  f.due.clear();
  for (size_t k = 0; k < f.items.size(); ++k) {
    Item& it = f.items[k];
    if (it.ready) {
      push_ready(f, k);
      continue;
    }
    if (it.awaited) continue;
    if (it.cache_slot < 0) it.data = scratch + it.scratch * read_bytes_;
    const bool probe = (count_hits_ && !f.prediction) || t.tracked;
    const bool resident = probe && L.in_page_cache(it.slot);
    if (count_hits_ && !f.prediction && resident) ++stats.page_cache_hits;
    // A copy of pages verified earlier needs no new checksum; pages gone come from the device.
    const bool check = trust_.read_needs_hash(L, t, it.slot, resident);
    if (t.due && !check && !f.prediction) ++stats.checksums_skipped;
    for (const Piece& p : L.pieces) {
      ReadRequest r;
      r.file = p.file;
      r.offset = p.at(it.slot);
      r.length = p.length;
      r.dest = const_cast<uint8_t*>(it.data) + p.dest_offset;
      f.reqs.push_back(r);
      f.req_item.push_back(uint32_t(k));
      f.due.push_back(check);
    }
    it.pieces_left = uint32_t(L.pieces.size());
    if (f.prediction) continue;  // counted when its thread takes the batch (it may be cancelled)
    ++stats.experts_read;
    stats.bytes_read += L.layout.bytes;
  }
  f.checksum.assign(f.reqs.size(), 0);
}

}  // namespace moestream::engine_store
