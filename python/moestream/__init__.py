"""moestream: Mixture-of-Experts inference with experts streamed from SSD, from Python.

A thin layer over the C++ engine (`moestream._moestream`); see __init__.pyi for the signatures.
"""
from ._moestream import (  # noqa: F401
    PHASE_DECODE,
    PHASE_PREFILL,
    ConfigError,
    Error,
    FormatError,
    GenerationStream,
    IoError,
    Model,
    RoutingLog,
    Tokenizer,
    cluster,
    cost,
    load_io_profile,
    options,
    token_read_cost,
)

__all__ = [
    "Error", "IoError", "FormatError", "ConfigError",
    "Model", "Tokenizer", "GenerationStream", "RoutingLog",
    "cluster", "cost", "token_read_cost", "load_io_profile", "options",
    "PHASE_PREFILL", "PHASE_DECODE",
]
