# Sourced by device_kernel_profile.sh and device_kernel_detail.sh (run THERE, on the device
# machine): $O for the results that come back ($OUT, created), $BIN (default
# build-device-gpu/bin, its infer built), $NCU (Nsight Compute's command line) and $P (the
# 16-id prompt both profile). Exits naming the calling script when ncu or infer is missing.
me=$(basename "$0" .sh)
O=${OUT:-/tmp/moestream_out}
BIN=${BIN:-build-device-gpu/bin}
mkdir -p "$O"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1 || true)
[ -n "$NCU" ] && [ -x "$NCU" ] || { echo "$me: no ncu on this machine" >&2; exit 1; }
[ -x "$BIN/infer" ] || { echo "$me: no $BIN/infer (build it first)" >&2; exit 1; }
P=$(python3 -c "print(','.join(str((7919 * i + 11) % 151936) for i in range(16)))")
