"""docs/results.md's Fashion-MNIST CNN trained with Hugging Face Accelerate and gradcomp's
communication hook, on CPU processes of this machine (gloo):

    accelerate launch --cpu --num_processes 2 examples/accelerate_fashion_mnist.py
    torchrun --standalone --nproc_per_node 2 examples/accelerate_fashion_mnist.py

What Accelerate needs is three lines: a State, the model prepared (wrapped in
DistributedDataParallel when there are several processes), and the hook registered on
it (docs/torch.md, "Lightning and Accelerate"). Prints, on the main process, the test
accuracy and the hook's figures for the last step (State.stats()).
"""
import argparse

import torch
from accelerate import Accelerator
from fashion_mnist import cnn, load, training_arguments  # beside this file
from torch.utils.data import DataLoader, TensorDataset

from gradcomp.torch import ddp


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    args = training_arguments(parser).parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)

    accelerator = Accelerator(cpu=True)
    x, y = load("train")
    loader = DataLoader(TensorDataset(x[:args.train], y[:args.train]), batch_size=32, shuffle=True)
    state = ddp.State(method=args.method, density=args.density, start_iter=args.start_iter)
    net = cnn()
    model, optimizer, loader = accelerator.prepare(net, torch.optim.SGD(net.parameters(), lr=args.lr), loader)
    if accelerator.num_processes > 1:
        model.register_comm_hook(state, ddp.hook)

    model.train()
    for _ in range(args.epochs):
        for xb, yb in loader:
            loss = torch.nn.functional.cross_entropy(model(xb), yb)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
    if accelerator.is_main_process:
        tx, ty = load("test")
        with torch.no_grad():
            accuracy = (accelerator.unwrap_model(model)(tx).argmax(dim=1) == ty).float().mean().item()
        print(f"accelerate: {accelerator.num_processes} ranks, {args.method} at density {args.density}: test "
              f"accuracy {100 * accuracy:.2f}%, hook {state.stats()}", flush=True)


if __name__ == "__main__":
    main()
