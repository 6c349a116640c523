#!/usr/bin/env bash
# The GPU measurements, in stages that each fit one call of a lent machine (10 minutes a
# command; keep each stage under 6 minutes on an H100): run from the repository root,
#
#   bash bench/device-run.sh step     # the decode step: XL and B profiles (fp32/bf16, 1 and 8 images), AR end to end
#   bash bench/device-run.sh kernels  # the block products and attention: cuBLAS / cuDNN against specrt's Triton kernels,
#                                     # then the XL step (bf16, W = 1, 1 and 8 images) with each: products separate /
#                                     # fused / skinny, attention sdpa / triton
#   bash bench/device-run.sh tests    # the round's GPU chi-squares, the CUDA-graph and round tests, then a smoke bench
#   bash bench/device-run.sh demo     # every method, PyTorch + CUDA graphs, batch 1 and 8
#   bash bench/device-run.sh trees    # chains vs static vs dynamic trees, both drafts, batch 1 and 8
#   bash bench/device-run.sh plans    # plan-tree for both drafts, then chains vs planned trees
#   bash bench/device-run.sh round    # the device round vs the host loop, the same settings side by side, batch 1 and 8
#                                     # (the draft GPT, then the EAGLE head drafting, then the MAR demo's ar and cspd)
#   bash bench/device-run.sh round-xl # the same loops at GPT-XL size (random weights): meas/pred of ar, sd, sjd, sjd-pac
#   bash bench/device-run.sh auto     # --method auto beside the fixed lossless settings it chooses from, and gsd, on the round
#   bash bench/device-run.sh serve    # the scheduler under open-loop load: in flight against whole calls (no Triton there)
#
# Each stage writes its text, JSON and Markdown into a folder named for the device, the date and
# the stage (h100-2026-11-27-round, say) under $OUT (the device tool's return folder) or, without
# it, bench/results/; each file is headed by the command and the GPU's name, and the folder is
# ready to be copied into bench/results/ as it is. The machine has torch, onnx, onnxruntime, click
# and numpy but nothing can be fetched there, so specrt is installed from this checkout without
# dependencies. IMAGES and DEVICE override the image counts and the torch device, LOAD_SECONDS the serve
# stage's seconds a load (default 15), STEP_MATMULS the torch step's block products (separate, fused or
# skinny; CUDA's default is fused: STEP_MATMULS=separate reruns a stage with LlamaGen's own), PLAN_ARGS adds
# plan-tree flags, STEP_ARCHS the step stage's profiles (IMAGES=2 DEVICE=cpu STEP_ARCHS=B
# PLAN_ARGS='--max-nodes 6 --repeats 2 --probe-width 2 --probe-depth 2' checks the script itself
# on a machine without a GPU, into a cpu-... folder). The step stage compiles
# each (model, dtype, batch, window) once (inductor's cache: TORCHINDUCTOR_CACHE_DIR).
set -euo pipefail
stage="${1:?usage: bash bench/device-run.sh step|kernels|tests|demo|trees|plans|round|round-xl|auto|serve}"
case "$stage" in
    step|kernels|tests|demo|trees|plans|round|round-xl|auto|serve) ;;
    *) echo "bench/device-run.sh: unknown stage '$stage' (step, kernels, tests, demo, trees, plans, round, round-xl, auto or serve)" >&2; exit 2 ;;
esac
device="${DEVICE:-cuda}"
export PYTHONUNBUFFERED=1

if ! python3 -c "import specrt" 2>/dev/null; then
    python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null
fi
gpu="$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 || true)"
machine="${gpu:-no GPU ($(uname -m))}, torch $(python3 -c 'import torch; print(torch.__version__)')"
# the folder's device: the GPU model's first word ("NVIDIA H100 80GB HBM3" -> h100), cpu on a CPU run
if [ "$device" = cpu ] || [ -z "$gpu" ]; then
    named=cpu
else
    named="$(echo "$gpu" | sed 's/^NVIDIA //I' | awk '{print tolower($1)}')"
fi
out="${OUT:-bench/results}/$named-$(date -u +%F)-$stage"
mkdir -p "$out"
bench=(python3 -m specrt.cli bench --backend torch --device "$device" --threads 1 ${STEP_MATMULS:+--step-matmuls "$STEP_MATMULS"})
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
    kernels)
        # each block product and one layer's attention alone (CUDA graphs of 100), then the whole XL step with
        # each way of running them: products separate / fused / skinny, attention sdpa / triton
        if [ "$device" != cpu ]; then
            run step-kernels-XL python3 -m specrt.bench.step_kernels --arch GPT-XL --rows 2,16
            settings="separate:sdpa fused:sdpa skinny:sdpa fused:triton skinny:triton"
        else
            settings="separate:sdpa fused:sdpa"
        fi
        for setting in $settings; do
            matmuls="${setting%%:*}" attention="${setting##*:}"
            run "step-profile-${STEP_ARCHS:-XL}-$matmuls-$attention" "${bench[@]}" \
                --profile-arch "llamagen-c2i-${STEP_ARCHS:-XL}" --step-matmuls "$matmuls" --step-attention "$attention" \
                --profile-dtypes bf16 --profile-images 1,8 --windows 1 --repeats 5 --precision none \
                --json "$out/step-profile-${STEP_ARCHS:-XL}-$matmuls-$attention.json"
        done
        ;;
    tests)
        # a failing test is written down and the stage goes on (the smoke bench still runs); it exits 1 at the end
        failed=0
        if [ "$device" != cpu ]; then
            # the round's exactness on the GPU: each chi-square / KS statistic printed beside its critical value,
            # every setting's planted bug beside it (20,480 images a setting; about a minute on an H100)
            python3 -m pytest -v -s -p no:cacheprovider tests/runtime/test_rounds_cuda_exactness.py 2>&1 \
                | tee "$out/pytest-cuda-exactness.txt" || failed=1
            # the CUDA-graph and round tests (the draft-chain and draft-tree tests touch no GPU: the CPU suite runs them)
            python3 -m pytest -q -p no:cacheprovider tests/runtime/test_cuda_graphs.py tests/runtime/test_rounds_cuda.py \
                tests/models/test_skinny_matmul.py tests/models/test_window_attention.py 2>&1 | tee "$out/pytest-cuda.txt" || failed=1
        fi
        run smoke "${bench[@]}" --methods ar,sd --images "${IMAGES:-8}"
        exit "$failed"
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
    round)
        n="${IMAGES:-64}"
        # every setting once on the host loop and once as the device round (rows 'loop=host' / 'loop=round';
        # speed-up and host % against ar in the same loop, syncs/round beside them; a round row's pred. is its
        # host twin's graph-time speed-up, so its meas/pred is how much of that the round reaches): the families
        # the round has, sd's chain, static and dynamic trees, cool-sd at relaxation_budget 4, sjd-pac as by default
        # (proactive drafting, spine trees) and without proactive drafting (chain windows only)
        run round-gpu "${bench[@]}" --methods ar,sd,cool-sd,lantern,sjd,sjd-pac --sweep 'cool-sd:delta=4' \
            --sweep 'sd:tree=chain,static,dynamic' \
            --sweep 'sjd-pac:proactive_drafting=true,false' --loop host,round --batch 1,8 --images "$n" \
            --json "$out/round-gpu.json" --markdown "$out/round-gpu.md"
        # the same side by side with the demo's EAGLE head drafting sd's chain, static and dynamic trees
        run round-eagle-gpu "${bench[@]}" --methods ar --sweep 'sd:tree=chain,static,dynamic' --drafts eagle \
            --loop host,round --batch 1,8 --images "$((n / 2))" --json "$out/round-eagle-gpu.json" \
            --markdown "$out/round-eagle-gpu.md"
        # the continuous family (the MAR demo: ar against cspd at draft_len 2, 4, 8) on both loops: host % and
        # syncs/round beside each speed-up, the round's speed-up over the host loop read from the loop=... rows
        m=$((n / 4)); [ "$m" -ge 1 ] || m=1
        run round-mar-gpu "${bench[@]}" --demo mar --loop host,round --batch 1,8 --images "$m" \
            --json "$out/round-mar-gpu.json" --markdown "$out/round-mar-gpu.md"
        ;;
    round-xl)
        # the loop at full size: GPT-XL 256 px bf16, random weights (acceptance is whatever it is), a random
        # GPT-B draft, eager steps (each window size compiled would cost minutes here); meas/pred is what
        # each loop keeps of its model passes' speed-up, at batch 1 and 8
        run round-xl python3 -m specrt.bench.ar_timing --arch GPT-XL --image-size 256 --dtype bf16 --images 1,8 \
            --device "$device" --repeats 1 --no-compile --methods ar,sd,sjd,sjd-pac --loop host,round \
            --draft-arch GPT-B
        ;;
    auto)
        n="${IMAGES:-64}"
        # the choice against the settings it chooses from, on the device round at batch 1 and 8: auto's row must be
        # >= 0.97x ar and within 5% of the best fixed lossless row; its probe is remeasured in this run (no cache);
        # gsd (relaxed) and sjd's couplings beside them; sjd-pac from window 16 (its spine trees need it for a round)
        run auto-gpu "${bench[@]}" --methods ar,sd,sjd,sjd-pac,gsd,auto --sweep 'sd:L=1,2,4' \
            --sweep 'sjd:L=4,8,16;coupling=independent,gumbel' --sweep 'sjd-pac:L=16,64' --loop round --batch 1,8 \
            --images "$n" --json "$out/auto-gpu.json" --markdown "$out/auto-gpu.md"
        ;;
    serve)
        # in-flight batching on the GPU: the runtime's scheduler in this process (PyTriton is not on the machine),
        # images entering between device rounds against whole generate calls (a dynamic batcher's batches), the
        # demo with sjd under open-loop Poisson load at fractions of whole calls' saturated throughput; p50/p99 per
        # load, saturated throughput, every answer's tokens against the same request alone; then a mixed load
        # (ar, sd, sjd: three groups) at 0.5x and 0.75x
        s="${LOAD_SECONDS:-15}"
        run serve-gpu "${bench[@]}" --serve --in-process --loads 0.25,0.5,0.75,1.0,1.5 --rate-seconds "$s" \
            --overload-seconds "$((2 * s))" --saturation-seconds "$s" --json "$out/serve-gpu.json" \
            --markdown "$out/serve-gpu.md" --plot "$out/serve-gpu.png"
        run serve-mixed-gpu "${bench[@]}" --serve --in-process --methods ar,sd,sjd --loads 0.5,0.75 \
            --rate-seconds "$s" --saturation-seconds "$s" --json "$out/serve-mixed-gpu.json" \
            --markdown "$out/serve-mixed-gpu.md"
        ;;
esac
