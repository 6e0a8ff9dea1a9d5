#!/bin/sh
# Bind this rank to one GPU *before* the program starts (and before MPI initialises, which is too late to
# change CUDA_VISIBLE_DEVICES from Python). Usage: gpu_affinity.sh local-rank|reverse-local-rank PROGRAM ARGS...
# reverse-local-rank pairs local rank 0 with the last GPU, the order ALCF uses on Polaris, where GPU3 is
# nearest CPUs 0-7.
mode=$1
shift
local_rank=${PMI_LOCAL_RANK:-${OMPI_COMM_WORLD_LOCAL_RANK:-${MPI_LOCALRANKID:-${SLURM_LOCALID:-0}}}}
ngpus=${ENVBUILDER_GPUS_PER_NODE:-$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')}
if [ "${ngpus:-0}" -gt 0 ]; then
    case $mode in
        reverse-local-rank) gpu=$((ngpus - 1 - local_rank % ngpus)) ;;
        local-rank) gpu=$((local_rank % ngpus)) ;;
        *) echo "gpu_affinity.sh: unknown mode '$mode'" >&2; exit 2 ;;
    esac
    CUDA_VISIBLE_DEVICES=$gpu
    export CUDA_VISIBLE_DEVICES
fi
exec "$@"
