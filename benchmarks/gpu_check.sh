#!/usr/bin/env bash
# One prepared check of the project's GPU paths, for a session lent a GPU for a few minutes (at most 10 in all; about 8 expected).
# Each step is time-boxed and writes one file into RESULTS; a step that fails or runs out of time does not stop the
# next. Run from the repository root of a checkout on the GPU machine:
#
#   bash benchmarks/gpu_check.sh RESULTS
#
# What it needs beside the checkout (made on a CPU machine first; docs/BENCHMARKS.md, "On a GPU", says how):
#   .whl/                    wheels of what the GPU machine's python lacks or has too old (transformers, datasets...)
#   .gpu/multi30k-en-de/     `vanilla-transformer prepare` of Multi30k en-de (vocabulary 8000)
#   .gpu/lines.en            the first 20,000 English lines of Multi30k's train split
# A dry run on a CPU, to check every command before the GPU's minutes: GPU_CHECK_DRY_RUN=1 (tiny model, CPU, no FSDP).
set -u
results=${1:?usage: bash benchmarks/gpu_check.sh RESULTS}
mkdir -p "$results"
runs=$(mktemp -d)  # training runs' folders: not brought back
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
python=python3
preset=base device=cuda training_batch=() generation_size=() translate_lines=600
if [ -n "${GPU_CHECK_DRY_RUN:-}" ]; then
    preset=tiny device=cpu training_batch=(--sentences 16 --vocab_size 1000) generation_size=(--vocab_size 1000 --batches 1 4)
    translate_lines=64
fi

# step NAME SECONDS COMMAND...: the command's output into RESULTS/NAME.txt, ended by its exit status and seconds
step() {
    local name=$1 seconds=$2 started=$SECONDS
    shift 2
    echo "== $name: at most ${seconds} s, from $(date -u +%T)"
    timeout --signal=INT --kill-after=20 "$seconds" "$@" >>"$results/$name.txt" 2>&1
    local status=$?
    echo "[exit status $status after $((SECONDS - started)) s]" >>"$results/$name.txt"
    tail -n 25 "$results/$name.txt"
}

# 1. the machine, and the wheels that replace or add packages
{
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader
    nvidia-smi | head -n 12
    if [ -d .whl ] && [ -z "${GPU_CHECK_DRY_RUN:-}" ]; then
        $python -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    fi
} >"$results/1_machine.txt" 2>&1
export PYTHONPATH=/tmp/site:$PWD
{
    $python -c 'import sys, torch, transformers, accelerate, datasets, evaluate, tokenizers
print("python", sys.version.split()[0], "| torch", torch.__version__, "cuda", torch.version.cuda,
      "| transformers", transformers.__version__, "| accelerate", accelerate.__version__,
      "| datasets", datasets.__version__, "| tokenizers", tokenizers.__version__)
print(torch.cuda.get_device_name(), torch.cuda.get_device_properties(0).multi_processor_count, "SMs")'
    $python -m pip list 2>/dev/null | grep -iE '^(pyarrow|fsspec|huggingface.hub|sacrebleu|safetensors|numpy) '
    timeout 10 find /opt /usr -name 'libcublas.so.*' 2>/dev/null | head -n 4  # CTranslate2's wheels need CUDA 12's
} >>"$results/1_machine.txt" 2>&1
cat "$results/1_machine.txt"

# 2. base bf16 training throughput and MFU by attention kernel, one host sync a step's cost, and a profile
step 2_training_mfu 90 $python benchmarks/gpu_training.py --device $device --preset $preset "${training_batch[@]}" \
    --steps 8 --repetitions 3 \
    --variants sdpa sdpa_no_cudnn eager sdpa_host_sync --profile
# the same step compiled, replayed as CUDA graphs, with bf16 weights (FSDP2's policy), each against sdpa's losses
# (compilations untimed, but inside this step's time box)
step 2_training_mfu 240 $python benchmarks/gpu_training.py --device $device --preset $preset "${training_batch[@]}" \
    --steps 8 --repetitions 3 --variants sdpa sdpa_compiled sdpa_compiled_graphs bf16_weights bf16_weights_compiled

# 3. the real script on Multi30k, stopped by SIGTERM as a preempted job is, then resumed
train=(train_accelerate.py --prepared_data .gpu/multi30k-en-de --preset $preset --mixed_precision bf16
    --max_tokens 25000 --logging_steps 5 --save_steps 50 --eval_steps 100000 --eval_max_sentences 200
    --num_beams 4 --seed 1)
step 3_script 105 timeout --signal=TERM --kill-after=30 70 $python "${train[@]}" --output_dir "$runs/ddp"
step 3_script 75 $python "${train[@]}" --output_dir "$runs/ddp" --resume_from_checkpoint latest --max_minutes 1.4
cp "$runs/ddp/train_log.jsonl" "$results/3_script_train_log.jsonl" 2>/dev/null
cat "$runs/ddp/results.json" >>"$results/3_script.txt" 2>/dev/null

# 4. FSDP on one process: the same start, a checkpoint, a resume; its first losses against step 3's. Run once
# (2026-11-27, docs/BENCHMARKS.md); again with GPU_CHECK_FSDP=1. Accelerate runs FSDP on GPUs only.
if [ -z "${GPU_CHECK_DRY_RUN:-}" ] && [ -n "${GPU_CHECK_FSDP:-}" ]; then
launch=(accelerate launch --config_file configs/accelerate/fsdp.yaml --num_processes 1)
step 4_fsdp 65 timeout --signal=TERM --kill-after=15 45 "${launch[@]}" "${train[@]}" --output_dir "$runs/fsdp" \
    --save_steps 10
step 4_fsdp 50 "${launch[@]}" "${train[@]}" --output_dir "$runs/fsdp" --save_steps 10 \
    --resume_from_checkpoint latest --max_minutes 0.8
{
    echo "first logged losses, DDP (step 3) then FSDP:"
    head -n 3 "$runs/ddp/train_log.jsonl"
    head -n 3 "$runs/fsdp/train_log.jsonl"
} >>"$results/4_fsdp.txt" 2>&1
fi

# 5. generation: ours against MarianMTModel with the same weights, bf16; the static cache (compiled) against dynamic
step 5_generation 95 $python benchmarks/gpu_generation.py --device $device --preset $preset "${generation_size[@]}" \
    --repetitions 3

# 6. translating a corpus: 20,000 lines with the model backend in bf16, token batches
translate=($python -m vanilla_transformer translate "$runs/ddp" --input .gpu/lines.en --device $device
    --dtype bfloat16 --log_every 10)
step 6_translate 45 "${translate[@]}" --max_batch_tokens 16384 --output "$runs/lines.tokens.de"
# the model backend over a corpus's changing shapes, by attention kernel (random weights)
step 6_translate 45 $python benchmarks/gpu_translate.py --device $device --preset $preset --lines .gpu/lines.en \
    --tokenizer .gpu/multi30k-en-de/tokenizer --count $translate_lines

# 7. the tests of what differs on a GPU
export VANILLA_TRANSFORMER_GPU_TESTS_ON=$device  # cuda: a missing GPU is an error, not 10 skipped tests
step 7_gpu_tests 45 $python -m pytest -q -p no:cacheprovider -m gpu tests/test_gpu.py
echo "== done at $(date -u +%T)"
