#!/usr/bin/env bash
# The GPU measurements, in stages that each fit one call of a lent machine (10 minutes a
# command; keep each stage under 6 minutes on an H100): run from the repository root,
#
#   bash bench/device-run.sh step     # the decode step: XL and B profiles (fp32/bf16, 1 and 8 images), AR end to end
#   bash bench/device-run.sh tests    # the CUDA-graph, draft-chain and draft-tree tests, then a smoke bench
#   bash bench/device-run.sh demo     # every method, PyTorch + CUDA graphs, batch 1 and 8
#   bash bench/device-run.sh trees    # chains vs static vs dynamic trees, both drafts, batch 1 and 8
#   bash bench/device-run.sh plans    # plan-tree for both drafts, then chains vs planned trees
#   bash bench/device-run.sh verify   # chains verified on the device vs the same rows on the host
#
# Each stage writes its text, JSON and Markdown into $OUT (the device tool's return folder;
# bench/results/gpu otherwise), headed by the command and the GPU's name, ready to be copied
# into bench/results/ with the device named. The machine has torch, onnx, onnxruntime, click and
# numpy but nothing can be fetched there, so specrt is installed from this checkout without
# dependencies; array-api-compat (pure Python, a runtime dependency) comes from a wheel carried
# in .device-wheels/ (`pip download array-api-compat -d .device-wheels` here, then the device
# tool's carry: [".device-wheels"]) unless the machine has it. IMAGES and DEVICE override the image
# counts and the torch device, PLAN_ARGS adds plan-tree flags, STEP_ARCHS the step stage's profiles
# (IMAGES=2 DEVICE=cpu STEP_ARCHS=B PLAN_ARGS='--max-nodes 6 --repeats 2 --probe-width 2
# --probe-depth 2' checks the script itself on a machine without a GPU). The step stage compiles
# each (model, dtype, batch, window) once (inductor's cache: TORCHINDUCTOR_CACHE_DIR).
set -euo pipefail
stage="${1:?usage: bash bench/device-run.sh step|tests|demo|trees|plans|verify}"
out="${OUT:-bench/results/gpu}"
device="${DEVICE:-cuda}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1

if ! python3 -c "import array_api_compat" 2>/dev/null; then
    python3 -m pip install -q --no-index --find-links .device-wheels array-api-compat
fi
if ! python3 -c "import specrt" 2>/dev/null; then
    python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null
fi
gpu="$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 || true)"
machine="${gpu:-no GPU ($(uname -m))}, torch $(python3 -c 'import torch; print(torch.__version__)')"
bench=(python3 -m specrt.cli bench --backend torch --device "$device" --threads 1)
plan=(python3 -m specrt.cli plan-tree --backend torch --device "$device" --threads 1 ${PLAN_ARGS:-})

# run NAME COMMAND...: the command's cleaned output into $out/NAME.txt, headed by itself and the machine
run() {
    local name="$1"; shift
    { echo "\$ $*"; echo "($machine; bench/device-run.sh $stage)"
      "$@" 2>&1 | tr '\r' '\n' | grep -v "img/s\]\|s/img\]\|it/s\]\|^\[\|^exporting\|^ *$\|: round [0-9]*/\|^USDT"; } | tee "$out/$name.txt"
}

case "$stage" in
    step)
        # the decode step as the runtime runs it (static KV cache, compiled, CUDA graphs), against the eager step
        for arch in ${STEP_ARCHS:-XL B}; do
            run "step-profile-$arch" "${bench[@]}" --profile-arch "llamagen-c2i-$arch" --profile-dtypes bf16,fp32 \
                --profile-images 1,8 --windows 1,16 --repeats 5 --precision none --json "$out/step-profile-$arch.json"
        done
        run step-profile-XL-eager "${bench[@]}" --profile-arch llamagen-c2i-XL --no-compile --profile-dtypes bf16 \
            --profile-images 1 --windows 1,16 --repeats 5 --precision none
        # LlamaGen's sample_c2i.py setting: 256 px, CFG 4; compare with its generate() under torch.compile
        run ar-xl python3 -m specrt.bench.ar_timing --arch GPT-XL --image-size 256 --dtype bf16 --images 1,8 \
            --device "$device" --repeats 2
        ;;
    tests)
        [ "$device" = cpu ] || python3 -m pytest -q -p no:cacheprovider tests/runtime/test_cuda_graphs.py \
            tests/runtime/test_draft_chain.py tests/runtime/test_tree_call.py tests/runtime/test_growth_call.py tests/runtime/test_eagle_chain.py 2>&1 | tee "$out/pytest-cuda.txt"
        run smoke "${bench[@]}" --methods ar,sd --images "${IMAGES:-8}"
        ;;
    demo)
        n="${IMAGES:-180}"
        run demo-gpu "${bench[@]}" --batch 1,8 --images "$n" --json "$out/demo-gpu.json" \
            --markdown "$out/demo-gpu.md" --plot "$out/demo-gpu.png"
        ;;
    trees)
        n="${IMAGES:-48}"
        # fused_drafting=false: the same rounds drafted a pass per position or depth, for the A/B in one run
        run eagle-demo-gpu "${bench[@]}" --methods ar --sweep 'sd:tree=chain,static,dynamic;fused_drafting=true,false' \
            --drafts independent,eagle --batch 1,8 --images "$n" --json "$out/eagle-demo-gpu.json" \
            --markdown "$out/eagle-demo-gpu.md"
        ;;
    plans)
        n="${IMAGES:-48}"
        for draft in independent eagle; do
            run "plan-$draft" "${plan[@]}" --method sd --draft "$draft" --images "$n" --out "$out/plan-$draft.json"
        done
        run tree-plan-gpu "${bench[@]}" --methods ar --sweep 'sd:tree=chain;L=1,2,4' \
            --sweep "sd:tree=static;static_tree=mc_sim_7b_63,$out/plan-independent.json,$out/plan-eagle.json" \
            --drafts independent,eagle --images "$((n * 3))" --json "$out/tree-plan-gpu.json" --markdown "$out/tree-plan-gpu.md"
        ;;
    verify)
        n="${IMAGES:-48}"
        # device_verification=false: the same device rows verified on the host, the same tokens
        run verify-gpu "${bench[@]}" --methods ar --sweep 'sd:device_verification=true,false' \
            --sweep 'lantern:device_verification=true,false' --sweep 'sjd:device_verification=true,false' \
            --batch 1,8 --images "$n" --json "$out/verify-gpu.json" --markdown "$out/verify-gpu.md"
        ;;
    *)
        echo "bench/device-run.sh: unknown stage '$stage' (step, tests, demo, trees, plans or verify)" >&2
        exit 2
        ;;
esac
