#!/usr/bin/env bash
# Reproduces docs/results.md: data-parallel Fashion-MNIST training with every method
# (examples/train_fashion_mnist) under mpirun on this machine. Prints the raw tables.
# Takes about 10 minutes on 2 cores.
source "$(dirname "$0")/mpi_training.sh"

echo "== every method, 4 ranks, equal shards, 10 epochs"
train 4 --method all --epochs 10
echo "== traffic against the rank count (1 epoch): scalecom and the sparse all-gather of topk_ef"
for ranks in 2 4 8; do train "$ranks" --method scalecom --epochs 1 | tail -1 | sed "s/^/$ranks ranks: /"; done
for ranks in 2 4 8; do train "$ranks" --method topk_ef --epochs 1 | tail -1 | sed "s/^/$ranks ranks: /"; done
for shards in 1,2,3,4 1,1,1,9; do
  echo "== unequal shards $shards, 4 ranks, 10 epochs: uniform density (topk_ef) against DAGC's plan, 3 seeds"
  for seed in 1 2 3; do
    train 4 --method topk_ef --shards "$shards" --epochs 10 --seed "$seed" | tail -1 | sed "s/^/seed $seed: /"
    train 4 --method dagc --shards "$shards" --epochs 10 --seed "$seed" | tail -1 | sed "s/^/seed $seed: /"
  done
done
