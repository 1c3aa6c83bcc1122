"""docs/results.md's Fashion-MNIST CNN trained with PyTorch Lightning's DDP strategy and
gradcomp's communication hook, on CPU processes of this machine (gloo):

    python3 examples/lightning_fashion_mnist.py [--devices 2] [--method topk_ef] [--density 0.01]

What Lightning needs is three lines: a State, a callback that registers the hook on the
DDP model Lightning makes, and the Trainer with it (docs/torch.md, "Lightning and
Accelerate"). Lightning's own `DDPStrategy(ddp_comm_state=..., ddp_comm_hook=...)`
registers a hook on CUDA devices only; the callback works on any. Lightning starts the
other processes by running this script again. Prints, on rank 0, the test accuracy and
the hook's figures for the last step (State.stats()).
"""
import argparse

import lightning as L
import torch
from fashion_mnist import cnn, load, training_arguments  # beside this file
from torch.utils.data import DataLoader, TensorDataset

from gradcomp.torch import ddp


class CommHook(L.Callback):
    """Registers gradcomp's hook with ``state`` on the DistributedDataParallel model that
    Lightning's DDP strategy has made when fitting starts."""

    def __init__(self, state):
        self.state = state

    def on_fit_start(self, trainer, pl_module):
        trainer.strategy.model.register_comm_hook(self.state, ddp.hook)


class Classifier(L.LightningModule):
    def __init__(self, lr):
        super().__init__()
        self.net = cnn()
        self.lr = lr

    def training_step(self, batch, batch_index):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", type=int, default=2, help="CPU processes")
    args = training_arguments(parser).parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)

    state = ddp.State(method=args.method, density=args.density, start_iter=args.start_iter)
    hook = CommHook(state)
    trainer = L.Trainer(accelerator="cpu", devices=args.devices, strategy="ddp", callbacks=[hook],
                        max_epochs=args.epochs, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)

    x, y = load("train")
    loader = DataLoader(TensorDataset(x[:args.train], y[:args.train]), batch_size=32, shuffle=True)
    model = Classifier(args.lr)
    trainer.fit(model, loader)
    if trainer.global_rank == 0:
        tx, ty = load("test")
        with torch.no_grad():
            accuracy = (model.net(tx).argmax(dim=1) == ty).float().mean().item()
        print(f"lightning: {args.devices} ranks, {args.method} at density {args.density}: test accuracy "
              f"{100 * accuracy:.2f}%, hook {state.stats()}", flush=True)


if __name__ == "__main__":
    main()
