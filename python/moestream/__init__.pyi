# Type stubs for moestream (the pybind11 module `moestream._moestream`), so editors complete and
# type checkers see the signatures of the compiled API.
import os
from typing import Iterator, Mapping, Sequence

import numpy as np
import numpy.typing as npt

PHASE_PREFILL: int
PHASE_DECODE: int

class Error(RuntimeError): ...
class IoError(Error, OSError): ...
class FormatError(Error, ValueError): ...
class ConfigError(Error, ValueError): ...

class Tokenizer:
    @staticmethod
    def load(tokenizer_json: str | os.PathLike[str], tokenizer_config: str | os.PathLike[str] | None = None) -> Tokenizer: ...
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...
    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str: ...
    @property
    def vocab_size(self) -> int: ...
    @property
    def bos_id(self) -> int | None: ...
    @property
    def eos_id(self) -> int | None: ...
    def token_text(self, id: int) -> str: ...
    def token_id(self, token: str) -> int | None: ...

class GenerationStream(Iterator[str | int]):
    def __iter__(self) -> GenerationStream: ...
    def __next__(self) -> str | int: ...

class Model:
    def __init__(
        self,
        path: str | os.PathLike[str],  # a packed model directory, or a GGUF file (any shard of a split set)
        *,
        # The option table's Model keywords (runtime/engine/options_table.cpp, docs/options.md), in
        # its order; tests/python/test_options.py checks this list against moestream.options().
        threads: int = 0,
        ctx: int = 0,
        batch: int = 0,
        io: str = "auto",  # auto | uring | pread | mmap | simple (simple: packs only)
        io_direct: bool = False,
        host_cache_mb: int = 0,  # without io_direct: a UserWarning (experts cached twice)
        auto_direct: bool = True,  # a model larger than the memory room: O_DIRECT into a host cache, with a warning (False: page cache)
        io_qd: int = 32,
        io_rings: int = 0,
        io_threads: int = 0,
        coalesce_gap_kb: int = 64,
        max_read_kb: int = 1024,
        direct_max_read_kb: int = 4096,  # largest single read of an O_DIRECT file (io_direct=True)
        io_profile: str | os.PathLike[str] | None = None,  # device profile (bench_io --profile-out): per-batch merge rule
        verify_checksums: bool = True,
        moe_lookahead: int = 0,  # experts of layer L+1 read ahead during layer L (GPU cache with gpu=True, else the host tiers)
        gpu: bool = False,  # whole forward pass on the GPU; ConfigError without CUDA or a GPU
        gpu_cache_mb: int = 0,  # GPU expert cache in MiB; 0 = automatic (needs gpu=True)
        gpu_sync_layers: bool = False,  # read every layer's routing on the host (needs gpu=True; same tokens)
        gpu_preload: bool = False,  # every expert into the GPU cache at load (needs gpu=True; error if they do not fit)
        gpu_no_graphs: bool = False,  # resident decode without CUDA graphs (needs gpu=True; same tokens)
        gpu_pin_page_cache: bool = False,  # page-lock the model's files so GPU misses copy from the page cache by DMA (needs gpu=True)
        gpu_cpu_misses: bool = False,  # decode experts the GPU cache lacks computed on the CPU where their pages lie (needs gpu=True)
        cache_aware: bool = False,
        cache_tolerance: float = 0.1,
        cache_aware_union: bool = False,  # batches only (needs cache_aware=True)
        collect_routing: str | os.PathLike[str] | None = None,
        collect_router_inputs: bool = False,
        replay_routing: str | os.PathLike[str] | None = None,  # every layer's experts from a routing log
        lookahead_replayed: bool = False,  # benchmarks: the look-ahead predicts from the replayed log
    ) -> None: ...
    def generate(
        self,
        prompt: str | Sequence[int],
        max_tokens: int = 64,
        temperature: float = 0.8,
        top_p: float = 0.95,
        seed: int = 0,
        stream: bool = False,
        *,
        top_k: int = 40,
        ignore_eos: bool = False,
        min_p: float = 0.0,
        typical_p: float = 1.0,
        repeat_penalty: float = 1.0,
        repeat_last_n: int = 64,
        presence_penalty: float = 0.0,
        frequency_penalty: float = 0.0,
        logit_bias: Mapping[int, float] | None = None,
    ) -> str | list[int] | GenerationStream:
        """The sampler of `infer` and the server (runtime/model/sampler.h): the same parameters,
        the same order of operations and, for a seed, the same tokens."""
    def logits(self, token_ids: Sequence[int]) -> npt.NDArray[np.float32]:
        """[len(token_ids), vocab_size] logits of every position, from an empty cache."""
    def perplexity(self, text: str | Sequence[int], *, ctx: int = 0, stride: int = 0) -> dict[str, float | int]: ...
    def stats(self) -> dict[str, object]: ...
    def close_routing(self) -> None: ...
    @property
    def config(self) -> dict[str, object]: ...
    @property
    def tokenizer(self) -> Tokenizer: ...

class RoutingLog:
    def __init__(self, path: str | os.PathLike[str]) -> None: ...
    path: str
    layer: npt.NDArray[np.uint16]
    position: npt.NDArray[np.uint32]
    ids: npt.NDArray[np.uint16]        # [n_records, top_k]
    weights: npt.NDArray[np.float32]   # [n_records, top_k]
    request: npt.NDArray[np.uint64]
    phase: npt.NDArray[np.uint8]       # PHASE_PREFILL / PHASE_DECODE
    router_input: npt.NDArray[np.float32] | None  # [n_records, hidden] when every record has one
    warning: str
    valid_bytes: int
    truncated_bytes: int
    @property
    def model_hash(self) -> int: ...
    @property
    def n_layers(self) -> int: ...
    @property
    def n_experts(self) -> int: ...
    @property
    def top_k(self) -> int: ...
    @property
    def hidden(self) -> int: ...
    def __len__(self) -> int: ...

def cluster(
    model: str | os.PathLike[str],
    routing: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    method: str = "seriation",
    evaluate: str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | None = None,
    maps_out: str | None = None,
    repack: bool = False,
    shape_only: bool = False,
    io_profile: str | None = None,
    op_latency_us: float = 0.0,
    bandwidth_gbps: float = 0.0,
    neighbour_weight: float = 0.0,
    search_moves: int = 20000,
    coalesce_gap_kb: int = 64,
    max_read_kb: int = 1024,
    direct_max_read_kb: int = 4096,
    io_direct: bool = False,
) -> dict[str, object]: ...
def cost(
    model: str | os.PathLike[str],
    routing: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    slots: npt.NDArray[np.uint32] | None = None,
    shape_only: bool = False,
    io_profile: str | None = None,
    op_latency_us: float = 0.0,
    bandwidth_gbps: float = 0.0,
    coalesce_gap_kb: int = 64,
    max_read_kb: int = 1024,
    direct_max_read_kb: int = 4096,
    io_direct: bool = False,
) -> dict[str, float]: ...
def token_read_cost(
    slots: Sequence[int],
    *,
    expert_bytes: int,
    expert_stride: int,
    data_offset: int = 4096,
    gap_bytes: int = 65536,
    max_read_bytes: int = 1048576,
    direct_max_read_bytes: int = 4194304,
    direct: bool = False,
) -> tuple[int, int]: ...
def load_io_profile(path: str | os.PathLike[str]) -> dict[str, float]: ...
def options() -> list[dict[str, object]]:
    """The option table's Python rows: name, where ("Model" or "generate"), type, default,
    env (its environment variable or None), group and help, as docs/options.md lists them."""
