# Sourced by the device_io_* scripts (run THERE, on the device machine): strict mode, the repo
# root as working directory, $O for the results that come back ($OUT) and $W for scratch files
# on the machine's disk (O_DIRECT needs a real filesystem, not tmpfs), both created.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
O=${OUT:-/tmp/moestream_out}
W=${WORK_DIR:-$PWD/.work}
mkdir -p "$O" "$W"
