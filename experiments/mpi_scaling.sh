#!/usr/bin/env bash
# Reproduces docs/results.md "Traffic that does not grow with the workers": bytes per
# worker per step of the sparse all-gather (topk_ef), ScaleCom's cyclic exchange and
# Ok-Topk's global top-k (ok_topk) at W = 2, 4, 8 and 16 MPI ranks (oversubscribed on
# this machine), one epoch of 12,000 images each; then the accuracy of topk_ef and
# ok_topk after 10 epochs on 4 ranks. Prints the raw tables. About 15 minutes on 2 cores.
source "$(dirname "$0")/mpi_training.sh"

echo "== bytes per worker per step against the rank count (1 epoch of 12,000 images)"
for ranks in 2 4 8 16; do
  for method in topk_ef scalecom ok_topk; do
    train "$ranks" --method "$method" --epochs 1 --train-limit 12000 --test-limit 2000 | tail -1 | sed "s/^/$ranks ranks: /"
  done
done
echo "== accuracy, 4 ranks, 10 epochs: topk_ef over the all-gather against ok_topk, 3 seeds"
for seed in 1 2 3; do
  for method in topk_ef ok_topk; do
    train 4 --method "$method" --epochs 10 --seed "$seed" | tail -1 | sed "s/^/seed $seed: /"
  done
done
