// Tests that check the bytes an ExpertStore hands out take them as payloads: next_payload is
// ExpertStore::next_ready of a FetchForm::kPayload fetch, with only the payload kept.
#pragma once

#include <cstddef>
#include <cstdint>

#include "loader/store/expert_store.h"

namespace moestream::test {

inline bool next_payload(ExpertStore& s, size_t* index, const uint8_t** payload, bool wait = true) {
  ExpertMatrices m;
  if (!s.next_ready(index, &m, wait)) return false;
  *payload = m.payload;
  return true;
}

}  // namespace moestream::test
