#!/usr/bin/env bash
# Builds the demo model's English corpus from Debian packages: download (no install), unpack,
# clean, split. Output: data/corpus/{train,heldout}.txt and the committed models/demo/heldout.txt.
set -euo pipefail
cd "$(dirname "$0")/../.."
CORPUS=data/corpus
PACKAGES=(dict-gcide linux-doc-6.1 python3.11-doc wordnet-base perl-doc python-django-doc
          dict-foldoc sword-text-web r-cran-janeaustenr fortunes)
# bible-kjv-text is left out: its bible.data is a custom compressed format ("EC02") that only
# the bible-kjv program reads; sword-text-web already supplies a full English Bible.

mkdir -p "$CORPUS/debs" "$CORPUS/root"
missing=()
for p in "${PACKAGES[@]}"; do
  compgen -G "$CORPUS/debs/${p}_*.deb" >/dev/null || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  # `apt-get download` needs package lists; refresh them once if the package is unknown.
  apt-cache show "${missing[0]}" >/dev/null 2>&1 || apt-get update -qq
  (cd "$CORPUS/debs" && apt-get download "${missing[@]}")
fi
for p in "${PACKAGES[@]}"; do
  dpkg-deb -x "$(compgen -G "$CORPUS/debs/${p}_*.deb" | head -1)" "$CORPUS/root"
done
python3 python/training/clean_corpus.py "$CORPUS/root" "$CORPUS"

# The committed held-out sample: whole documents, at most 2 MB.
python3 - "$CORPUS/heldout.txt" models/demo/heldout.txt <<'PY'
import os, sys
docs = open(sys.argv[1], encoding="utf-8").read().rstrip("\n").split("\n\n\n")
out, size = [], 0
for d in docs:
    n = len(d.encode("utf-8")) + 3
    if size + n > 2_000_000:
        break
    out.append(d)
    size += n
tmp = sys.argv[2] + ".tmp"
with open(tmp, "w", encoding="utf-8") as f:
    f.write("\n\n\n".join(out) + "\n")
    f.flush()
    os.fsync(f.fileno())
os.replace(tmp, sys.argv[2])
print(f"{sys.argv[2]}: {len(out)} documents, {size} bytes")
PY
