// The aligned buffer a store reads experts into: both stores grow one per fetch (the engine
// store's misses that the host cache does not take, the pread store's every expert).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>

#include "common/error.h"

namespace moestream {

class ExpertBuffer {
 public:
  // Room for `n` experts of `stride` bytes (a multiple of `align`) at an `align`-aligned address.
  // Grows, never shrinks, so payloads handed out stay valid until the next reserve; the contents
  // are not kept when it grows. IoError when out of memory.
  uint8_t* reserve(size_t n, size_t stride, size_t align) {
    const size_t bytes = n * stride;
    if (bytes <= bytes_) return data();
    void* p = std::aligned_alloc(align, bytes);
    if (p == nullptr) throw IoError("out of memory for " + std::to_string(n) + " expert buffers");
    p_.reset(static_cast<uint8_t*>(p));
    bytes_ = bytes;
    return data();
  }
  uint8_t* data() const { return p_.get(); }

 private:
  struct FreeDeleter {
    void operator()(uint8_t* p) const { std::free(p); }
  };
  std::unique_ptr<uint8_t, FreeDeleter> p_;
  size_t bytes_ = 0;
};

}  // namespace moestream
