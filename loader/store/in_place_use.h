// In-place page-cache use of the engine store: for a caller that takes experts as matrices
// (ExpertStore FetchForm::kMatrices), the experts whose pages the page cache holds are handed
// out as pages of the file's read-only mapping: nothing is read or copied, and a checksum runs
// only on a first use (checksum_trust.h). With the mmap backend every expert is (a page fault
// reads what is missing, as that backend's copy would) unless a checksum is due.
#pragma once

#include "loader/store/checksum_trust.h"
#include "loader/store/engine_fetch.h"
#include "loader/store/expert_layers.h"

namespace moestream::engine_store {

class InPlaceUse {
 public:
  // `fault_in`: the engine reads through the mapping (mmap backend); `count_hits`: resident
  // experts count as page-cache hits.
  InPlaceUse(const ExpertFiles& files, ChecksumTrust& trust, bool fault_in, bool count_hits)
      : files_(files), trust_(trust), fault_in_(fault_in), count_hits_(count_hits) {}

  // Hands out in place every item of demand fetch f (of layer L, a matrices fetch) that is not
  // ready, awaited or to be read again and that may be used where it is; the rest stay for reads.
  void place(Fetch& f, const Layer& L, ChecksumTrust::LayerTrust t, ExpertStoreStats& stats);

 private:
  const ExpertFiles& files_;
  ChecksumTrust& trust_;
  bool fault_in_, count_hits_;
};

}  // namespace moestream::engine_store
