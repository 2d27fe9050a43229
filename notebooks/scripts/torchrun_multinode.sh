#!/bin/bash
# Lesson 07: start one node of a multi-node DDP job by hand (no scheduler). Run this script on
# EVERY node, with the same HEAD (an address every node can reach) and NNODES:
#
#   HEAD=10.0.0.1 NNODES=2 NODE_RANK=0 bash notebooks/scripts/torchrun_multinode.sh   # on node 0
#   HEAD=10.0.0.1 NNODES=2 NODE_RANK=1 bash notebooks/scripts/torchrun_multinode.sh   # on node 1
#
# Two ways for the torchruns to find each other:
#   c10d (default): one rendezvous endpoint; node ranks are assigned as nodes arrive, a node
#     may join late (up to the rendezvous timeout), and --nnodes=MIN:MAX allows elastic jobs.
#   static (RDZV=static): the classic MASTER_ADDR/MASTER_PORT; every node must know its rank.
# Extra arguments go to the training script: bash torchrun_multinode.sh --epochs 5
set -euo pipefail
: "${HEAD:?set HEAD to the address of the first node}"
: "${NNODES:?set NNODES to the number of nodes}"
# one process per GPU this node's processes can use, counted by torch itself: it honours
# CUDA_VISIBLE_DEVICES and sees one device per MIG instance it may use (nvidia-smi --list-gpus
# lists every GPU and MIG instance of the machine, visible or not)
NPROC=${NPROC:-$("${PYTHON:-python}" -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)}
if [ "$NPROC" -lt 1 ]; then NPROC=1; fi      # no GPU: one CPU process (gloo)
PORT=${PORT:-29500}
JOB_ID=${JOB_ID:-feed-the-gpu}
SCRIPT=${SCRIPT:-notebooks/scripts/ddp_train.py}

if [ "${RDZV:-c10d}" = "static" ]; then
    : "${NODE_RANK:?static rendezvous needs NODE_RANK (0 on the head node)}"
    exec torchrun --nnodes="$NNODES" --nproc_per_node="$NPROC" --node_rank="$NODE_RANK" \
        --master_addr="$HEAD" --master_port="$PORT" "$SCRIPT" "$@"
else
    exec torchrun --nnodes="$NNODES" --nproc_per_node="$NPROC" --rdzv_backend=c10d \
        --rdzv_endpoint="$HEAD:$PORT" --rdzv_id="$JOB_ID" "$SCRIPT" "$@"
fi
