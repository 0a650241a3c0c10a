// Implementation of runtime/gpu/gpu_graphs.h.
#include "runtime/gpu/gpu_graphs.h"

#include <exception>
#include <string>

#include "common/error.h"
#include "common/option_ref.h"
#include "kernels/cuda/cuda_check.cuh"

namespace moestream {

GpuGraphSegments::~GpuGraphSegments() {
  for (cudaGraphExec_t e : execs_)
    if (e) cudaGraphExecDestroy(e);
}

void GpuGraphSegments::run(size_t i, cudaStream_t stream, const std::function<void()>& enqueue,
                           GpuGraphStats& st) {
  if (execs_.size() <= i) execs_.resize(i + 1, nullptr);
  // Relaxed: cuBLAS may set up its workspace on first use inside a capture.
  MOE_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
  try {
    enqueue();
  } catch (...) {
    cudaGraph_t g = nullptr;
    cudaStreamEndCapture(stream, &g);  // ends the capture; the partial graph is dropped
    if (g) cudaGraphDestroy(g);
    cudaGetLastError();
    throw;
  }
  cudaGraph_t g = nullptr;
  const cudaError_t e = cudaStreamEndCapture(stream, &g);
  if (e != cudaSuccess || !g) {
    cudaGetLastError();
    throw Error(std::string("gpu: the resident decode step could not be captured as a CUDA graph (") +
                cudaGetErrorString(e) + "); " + option_ref("gpu_no_graphs") + " runs it without graphs");
  }
  cudaGraphExec_t& x = execs_[i];
  bool updated = false;
  if (x) {
    cudaGraphExecUpdateResultInfo info{};
    updated = cudaGraphExecUpdate(x, g, &info) == cudaSuccess;
    if (!updated) {  // a change of shape: instantiate anew
      cudaGetLastError();
      cudaGraphExecDestroy(x);
      x = nullptr;
    }
  }
  if (!updated) {
    const cudaError_t ie = cudaGraphInstantiate(&x, g, 0);
    if (ie != cudaSuccess) {
      x = nullptr;
      cudaGraphDestroy(g);
      MOE_CUDA_CHECK(ie);
    }
    ++st.instantiations;
  } else {
    ++st.updates;
  }
  cudaGraphDestroy(g);
  MOE_CUDA_CHECK(cudaGraphLaunch(x, stream));
  ++st.launches;
}

}  // namespace moestream
