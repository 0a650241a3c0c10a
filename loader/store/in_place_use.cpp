// Implementation of loader/store/in_place_use.h.
#include "loader/store/in_place_use.h"

#include <vector>

namespace moestream::engine_store {

void InPlaceUse::place(Fetch& f, const Layer& L, ChecksumTrust::LayerTrust t, ExpertStoreStats& stats) {
  if (!f.matrices || f.prediction || !files_.in_place_allowed(L)) return;
  const bool fault_in = fault_in_ && !t.due;
  std::vector<size_t> first;  // items whose resident pages were never verified
  for (size_t k = 0; k < f.items.size(); ++k) {
    Item& it = f.items[k];
    if (it.ready || it.awaited || f.reread[k]) continue;
    const bool resident = L.in_page_cache(it.slot);
    const ChecksumTrust::InPlace v = trust_.in_place(L, t, it.slot, resident);
    if (v == ChecksumTrust::InPlace::kNo) continue;
    if (v == ChecksumTrust::InPlace::kFirstUse) {
      first.push_back(k);
      continue;
    }
    if (!resident && !fault_in) continue;
    hand_out_in_place(it, files_.mapped_matrices(L, it.slot), resident && count_hits_, stats);
  }
  if (first.empty()) return;
  std::vector<uint32_t> slots(first.size());
  std::vector<ExpertMatrices> ms(first.size());
  for (size_t i = 0; i < first.size(); ++i) {
    slots[i] = f.items[first[i]].slot;
    ms[i] = files_.mapped_matrices(L, slots[i]);
  }
  std::vector<uint8_t> ok;
  trust_.check_first_uses(L, slots, ms, ok, stats);
  for (size_t i = 0; i < first.size(); ++i)
    if (ok[i]) hand_out_in_place(f.items[first[i]], ms[i], count_hits_, stats);
}

}  // namespace moestream::engine_store
