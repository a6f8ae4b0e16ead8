#!/usr/bin/env bash
# The packages d1's diffu-GRPO pins (its env.yml), installed into OUTDIR for peer_d1.py: put first on the
# d1 loop's path only (run_peers.py --peer-pythonpath OUTDIR), carried to the GPU machine with the tree.
#
#   bash tests/benchmarks/peers/build_d1_lib.sh /tmp/peerlib_d1          # for the GPU machine (Python 3.12)
#   PYVER=3.11 bash tests/benchmarks/peers/build_d1_lib.sh /tmp/peerlib_d1   # for this machine's venv
#
# BUNDLE=DIR also packs into DIR what the d1 loop needs on a GPU machine without a package index (an
# untracked folder of the repository travels with the working tree): DIR/peerlib_d1.tar.gz (OUTDIR,
# ~18 MB), DIR/wheels (pydantic for the driver's own imports: that machine has no .whl),
# DIR/peers/d1/diffu-grpo and
# DIR/peers/StableDRL/networks/{modeling,configuration}_llada.py copied from PEERS (default /tmp/peers).
#
# - TRL: d1 pins the git commit 0f88c179 (0.16.0.dev0); no release has its GRPOTrainer (0.15.2 has no
#   num_iterations, 0.16.0 reads config fields d1's DiffuGRPOConfig does not define), so a wheel is built from
#   that commit: TRL_SRC=DIR (a checkout of it) or else pip fetches it from GitHub;
# - transformers 4.49.0, accelerate 1.4.0, peft 0.15.1 as d1 pins them; tokenizers and huggingface-hub at
#   versions transformers 4.49 accepts; requests (the hub client of 4.x) and its dependencies;
# - DeepSpeed (d1's accelerate config runs ZeRO-2): the project's own wheel (WHEELS, default .whl: 0.19.8 and
#   its pydantic; for PYVER other than 3.12 none: the interpreter's own); d1's 0.16.4 predates the GPU
#   machine's torch;
# - not installed: datasets (peer_d1.py stubs it with the generated rows), bitsandbytes (the base stays
#   bf16), wandb (stubbed), torch, numpy, safetensors, regex, pyyaml, tqdm, filelock, packaging, psutil
#   (the machine's own); rich (TRL's callbacks import it) with its dependencies.
set -euo pipefail
OUT=${1:?usage: build_d1_lib.sh OUTDIR}
PYVER=${PYVER:-3.12}
PY=${PYTHON:-python3}
WHEELS=${WHEELS:-.whl}
TRL_COMMIT=0f88c179e30b3439467942a08c3190f624d5c423
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if [ -n "${TRL_SRC:-}" ]; then
  "$PY" -m pip wheel -q --no-deps -w "$tmp" "$TRL_SRC"
else
  "$PY" -m pip wheel -q --no-deps -w "$tmp" "git+https://github.com/huggingface/trl.git@$TRL_COMMIT"
fi
ds=()
for w in deepspeed hjson pydantic pydantic_core annotated_types typing_inspection; do
  f=$(ls "$WHEELS"/"$w"-[0-9]*.whl 2>/dev/null | head -1 || true)
  [ -n "$f" ] && ds+=("$f")
done
if [ "$PYVER" != 3.12 ]; then
  ds=()  # the project's wheels are for 3.12; elsewhere the interpreter's own DeepSpeed (the project's venv)
elif [ ${#ds[@]} -lt 6 ]; then
  echo "DeepSpeed's wheels not found under $WHEELS (WHEELS=the project's .whl folder)" >&2
  exit 1
fi
"$PY" -m pip install -q --no-deps --no-compile --upgrade --target "$OUT" --python-version "$PYVER" \
  --implementation cp --platform manylinux2014_x86_64 --only-binary=:all: \
  "$tmp"/trl-*.whl transformers==4.49.0 tokenizers==0.21.0 huggingface-hub==0.29.1 accelerate==1.4.0 \
  peft==0.15.1 rich==13.9.4 markdown-it-py==3.0.0 mdurl==0.1.2 pygments==2.19.1 requests==2.32.3 urllib3==2.3.0 idna==3.10 certifi==2025.1.31 charset-normalizer==3.4.1 \
  "${ds[@]}"
rm -rf "$OUT"/bin
du -sh "$OUT"
if [ -n "${BUNDLE:-}" ]; then
  PEERS=${PEERS:-/tmp/peers}
  mkdir -p "$BUNDLE"/wheels "$BUNDLE"/peers/d1 "$BUNDLE"/peers/StableDRL/networks
  tar -czf "$BUNDLE"/peerlib_d1.tar.gz -C "$OUT" .
  for w in pydantic pydantic_core annotated_types typing_inspection; do cp "$WHEELS"/"$w"-[0-9]*.whl "$BUNDLE"/wheels/; done
  rm -rf "$BUNDLE"/peers/d1/diffu-grpo && cp -r "$PEERS"/d1/diffu-grpo "$BUNDLE"/peers/d1/
  cp "$PEERS"/StableDRL/networks/modeling_llada.py "$PEERS"/StableDRL/networks/configuration_llada.py \
    "$BUNDLE"/peers/StableDRL/networks/
  du -sh "$BUNDLE"
fi
