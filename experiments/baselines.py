"""What the experiments compare gradcomp against, and nothing of gradcomp's, so that the
torch-only runs work under any torch: torch's own communication hooks by name and a
counter of the bytes a rank puts into collectives."""
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

TORCH_HOOKS = ["dense", "fp16", "powersgd1", "powersgd4"]


class Traffic:
    """Counts the bytes this rank puts into collectives (the input tensors)."""

    def __init__(self):
        self.bytes = 0
        self.counting = False
        for name in ("all_reduce", "all_gather", "broadcast", "reduce"):
            original = getattr(dist, name)

            def counted(*args, _original=original, _name=name, **kwargs):
                if self.counting:
                    tensor = args[1] if _name == "all_gather" else args[0]
                    self.bytes += tensor.numel() * tensor.element_size()
                return _original(*args, **kwargs)

            setattr(dist, name, counted)


def torch_hook(name, start_iter):
    """(state, hook) of one of torch's hooks (TORCH_HOOKS): dense all-reduce, fp16, or
    PowerSGD of rank N with error feedback and warm start, compressing from start_iter."""
    if name == "dense":
        return None, default_hooks.allreduce_hook
    if name == "fp16":
        return None, default_hooks.fp16_compress_hook
    if name.startswith("powersgd"):
        state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=int(name[len("powersgd"):]),
                                            start_powerSGD_iter=start_iter, min_compression_rate=1.0,
                                            use_error_feedback=True, warm_start=True)
        return state, powerSGD_hook.powerSGD_hook
    raise ValueError(f"torch_hook: unknown hook {name!r} (one of {', '.join(TORCH_HOOKS)})")
