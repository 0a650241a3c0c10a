// Internal to runtime/gpu: the GPU pass's attention blocks, the device twins of the CPU's
// AttentionBlock (runtime/model/blocks.h). One object per attention kind the model's layers take
// (runtime/model/layer_plan.h) holds that kind's device state for each of its layers (the pass's
// own sequence, and the batch slots where the kind serves batches) and enqueues a layer's
// attention on the pass's stream: from the normalised rows in f.h, its output added to the
// residual f.x, with no host sync (resident decode and CUDA graphs run it as it is).
#pragma once

#include <cstddef>

#include "runtime/model/forward_pass.h"

namespace moestream::detail {

struct CudaForward;

class GpuAttention {
 public:
  virtual ~GpuAttention() = default;
  // Layer l for the chunk's T rows at positions n_past.. of the pass's own sequence.
  virtual void layer(CudaForward& f, int l, int T, int n_past) = 0;
  // Layer l over a batch step's rows (f.batch_splits), each entry against its slot's state.
  virtual void batch_layer(CudaForward& f, const ForwardBatch& b, int l) = 0;
  // Makes batch slot `slot`'s state before the timed layers; ConfigError when it does not fit.
  virtual void prepare_slot(CudaForward& f, int slot) = 0;
  // Every layer's matrices and kernels once on T scratch rows, before any forward reads the
  // state; a matrix type the kernels do not take is a ConfigError naming the layer and tensor.
  virtual void warm_up(CudaForward& f, int T) = 0;
  virtual size_t state_bytes() const = 0;    // the pass's own sequence's
  virtual size_t scratch_bytes() const = 0;  // beside the pass's activations
};

}  // namespace moestream::detail
