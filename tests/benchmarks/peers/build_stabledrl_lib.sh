#!/usr/bin/env bash
# The packages the StableDRL release pins, installed into OUTDIR for peer_stabledrl.py: put first on the
# release's path only (run_peers.py --peer-pythonpath OUTDIR), carried to the GPU machine with the tree.
#
#   bash tests/benchmarks/peers/build_stabledrl_lib.sh /tmp/peerlib            # for the GPU machine (Python 3.12)
#   PYVER=3.11 bash tests/benchmarks/peers/build_stabledrl_lib.sh /tmp/peerlib # for this machine's venv
#
# BUNDLE=DIR also packs what the release needs on a GPU machine into DIR (an untracked folder of the repository
# travels with the working tree; add it to .git/info/exclude and carry it): DIR/peerlib.tar.gz (OUTDIR,
# ~13 MB) and DIR/peers/StableDRL, a copy of the release from PEERS (default /tmp/peers; github
# JianyuanZhong/StableDRL) without its git history, datasets and assets (the harness feeds generated rows).
# The GPU machine then runs `tar -xzf DIR/peerlib.tar.gz -C /tmp/peerlib` and passes --peer-pythonpath /tmp/peerlib.
#
# - transformers 4.51.3 as the release pins it, with tokenizers and huggingface-hub at versions it accepts,
#   and requests (the hub client) with its dependencies;
# - datasets 3.5.0, which accepts that huggingface-hub: accelerate imports datasets when the machine has it,
#   and a newer one there fails against the release's hub client (peer_stabledrl.py stubs the release's own
#   use of it);
# - not installed: torch, accelerate, numpy, safetensors, pyyaml, regex, tqdm, filelock, packaging (the
#   machine's own); math_verify (peer_stabledrl.py stubs it).
set -euo pipefail
OUT=${1:?usage: build_stabledrl_lib.sh OUTDIR}
PYVER=${PYVER:-3.12}
PY=${PYTHON:-python3}
"$PY" -m pip install -q --no-deps --no-compile --upgrade --target "$OUT" --python-version "$PYVER" \
  --implementation cp --platform manylinux2014_x86_64 --only-binary=:all: \
  transformers==4.51.3 tokenizers==0.21.1 huggingface-hub==0.30.2 requests==2.32.3 urllib3==2.3.0 idna==3.10 \
  certifi==2025.1.31 charset-normalizer==3.4.1 datasets==3.5.0
rm -rf "$OUT"/bin
du -sh "$OUT"
if [ -n "${BUNDLE:-}" ]; then
  PEERS=${PEERS:-/tmp/peers}
  [ -f "$PEERS"/StableDRL/train.py ] || { echo "no StableDRL release under $PEERS (PEERS=DIR)" >&2; exit 1; }
  mkdir -p "$BUNDLE"/peers
  tar -czf "$BUNDLE"/peerlib.tar.gz -C "$OUT" .
  rm -rf "$BUNDLE"/peers/StableDRL && cp -r "$PEERS"/StableDRL "$BUNDLE"/peers/
  rm -rf "$BUNDLE"/peers/StableDRL/.git "$BUNDLE"/peers/StableDRL/datasets "$BUNDLE"/peers/StableDRL/assets
  du -sh "$BUNDLE"
fi
