"""Page-cache control for the benchmarks: drop a file's cached pages (cold reads) or read it
through once (warm reads). Imported by bench/decode.py and bench/server/bench_server.py."""
import os


def drop_file_cache(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def warm_file(path):
    with open(path, "rb", buffering=0) as f:
        while f.read(8 << 20):
            pass
