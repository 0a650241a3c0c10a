// Test hooks of the fake CUDA runtime (tests/fake_cuda_runtime.cpp), for tests built against it
// (MOESTREAM_FAKE_CUDA): inject allocation failures and look at what the "device" holds.
#pragma once

#include <cstddef>

namespace moestream::fake_cuda {

// After `skip` more successful cudaMalloc calls, the next `n` return cudaErrorMemoryAllocation.
void fail_next_mallocs(int n, int skip = 0);
// Bytes of the cudaMalloc allocations not yet freed.
size_t live_device_bytes();
// Host ranges registered (cudaHostRegister) and not yet unregistered.
size_t registered_ranges();
// Operations enqueued on any stream that have not run yet.
size_t pending_ops();

}  // namespace moestream::fake_cuda
