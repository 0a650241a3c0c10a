// Unaligned loads of the little-endian integers the file formats store (GGUF blocks, layer
// files, routing logs, expert maps): memcpy, so no alignment or aliasing trap. Little-endian
// hosts only (x86-64, aarch64), as the formats state. Header-only; not for the kernels/cpu/*_avx2.cpp
// units, which keep their own loads: an inline template instantiated there could be the copy the
// linker keeps for CPUs without AVX2.
#pragma once

#include <cstring>
#include <type_traits>

namespace moestream {

template <class T>
inline T load_le(const void* p) {
  static_assert(std::is_trivially_copyable_v<T>);
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

}  // namespace moestream
