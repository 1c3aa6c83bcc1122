"""What a compression method buys on a cluster, predicted from costs measured on one machine.

A step-time model of data-parallel training as DDP schedules it (docs/results.md, "What it
buys at scale", validates it against the emulated cluster and tables it for two models):

- forward, then backward, which makes the gradient buckets ready one after another, at
  times measured on the user's own machine (``Bucket.ready``);
- for each bucket, in the order DDP hands them to the hook, the hook's work: its
  compression, its collectives, its decoding. One bucket's work starts when the bucket is
  ready and the previous bucket's is done (DDP's collectives run in bucket order, and
  gradcomp's hook runs each bucket's exchange on one thread);
- compression and decoding (and the share of a collective the transport itself computes
  there, ``Link.busy``: gloo's copies and sums on CPU ranks) compute on the processor
  backward runs on (the GPU, or the
  CPU cores of a CPU rank), so they take their time from backward: one queue, served in
  the order work becomes ready, before backward (which goes on in the gaps). The
  collectives run on the network meanwhile;
- the optimizer after backward and the last bucket's decoding.

Each collective costs what an alpha-beta model of the algorithm gloo and NCCL run says:
``Link.seconds(nbytes) = latency + 8 * nbytes / (rate * efficiency)`` per message, a ring
all-reduce 2(W - 1) messages of nbytes/W (or, where it is faster and the link allows it,
``Link.tree_all_reduce``, a pipelined tree: the latency of 2 log2 W messages and twice
the bytes; gloo's is always a ring), a ring all-gather W - 1 messages of the part, a
reduce-scatter W - 1 of nbytes/W, an all-to-all W - 1 of what each rank gets, and a
broadcast a binomial tree's log2 W (gloo's; NCCL's pipelined ring is faster); and no
collective less than the least its kind was measured to take (``Link.floors``).

What each method puts on the wire per bucket of n floats (docs/communication.md):
dense all-reduces 4n bytes; fp16 2n; PowerSGD of rank r all-reduces its vectors, then
P (rows x r per matrix) and Q (columns x r); gradcomp's top-k methods all-gather one
message of k entries (k = ceil(density * n)) with the step's 24-byte verdict, padded to
the bound the ranks agreed (an eighth above the longest message, in 64 bytes); ScaleCom
all-gathers 40-byte frames, broadcasts the leader's k indices and reduces and broadcasts
k values; the global top-k (``sparse_allreduce``) all-gathers 40-byte frames, sends about
k entries in an all-to-all of blocks of equal room, and all-gathers the k selected ones
in parts, with six small collectives. A method's
measured costs (``Costs``) give its compression time per bucket and its decoding time
per received entry.

From the command line, with the costs a user measured (a JSON file, see ``load``)::

    python -m gradcomp.plan costs.json --world 8,32,128 --link 10gbit,100gbit

prints, per world size and link, each method's predicted step and its speedup over dense.
"""

from __future__ import annotations

import argparse
import json
import math
import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from .errors import InvalidArgumentError

__all__ = ["Link", "parse_rate", "collective_seconds", "count", "Bucket", "Costs", "Workload", "traffic", "Prediction",
           "predict", "load", "plan", "main"]

VERDICT_BYTES = 24  # the agreement each gradcomp exchange starts with (docs/communication.md)
FRAME_BYTES = 40  # ScaleCom's and Ok-Topk's first collective: the verdict and two sizes of their later ones
SPARSE_RECORD_BYTES = 16  # what each rank tells the others of its region in Ok-Topk's exchange
MESSAGE_HEADER_BYTES = 56  # a message's fixed header (docs/wire-format.md)
RADIX_HISTOGRAM_BYTES = (1028, 1024, 1024, 512)  # sparse_allreduce's global radix select (the first with the count)
ALLGATHER_METHODS = ("topk_ef", "dgc", "adacomp", "random_k", "threshold")


@dataclass(frozen=True)
class Link:
    """One rank's network link: its rate in bits per second, the latency of one message,
    and the share of the rate that carries payload (framing, protocol, the transport's
    own copies)."""

    bits_per_second: float
    latency: float = 10e-6
    efficiency: float = 1.0
    fitted: Dict[str, Tuple[float, float]] = field(default_factory=dict, compare=False)
    """(latency, efficiency) of the collectives measured apart, by name: where a transport's
    collectives differ from one another (gloo on a few cores); the others take the link's."""
    busy: Dict[str, float] = field(default_factory=dict, compare=False)
    """The share of a collective's seconds that the transport computes on the processor
    backward runs on, by name (measured: gloo's copies, sums and socket calls on CPU
    ranks), which backward then waits for; none where it is not named (NCCL's runs
    beside backward)."""
    tree_all_reduce: bool = True
    """Whether an all-reduce of few bytes among many ranks may take a tree (NCCL picks one);
    gloo's all-reduce is a ring whatever its size."""
    floors: Dict[str, float] = field(default_factory=dict, compare=False)
    """The least seconds one collective of a kind takes, by name, measured (its smallest):
    where a collective's fixed cost exceeds what its messages' latencies say (gloo with
    ranks that share cores, where each hop waits for a process to be scheduled)."""

    def __post_init__(self):
        if not (self.bits_per_second > 0 and math.isfinite(self.bits_per_second)):
            raise InvalidArgumentError(f"Link: bits_per_second must be positive, got {self.bits_per_second}")
        if not (self.latency >= 0 and math.isfinite(self.latency)):
            raise InvalidArgumentError(f"Link: latency must be >= 0 seconds, got {self.latency}")
        if not 0 < self.efficiency <= 1:
            raise InvalidArgumentError(f"Link: efficiency must be in (0, 1], got {self.efficiency}")
        if not isinstance(self.busy, dict):
            raise InvalidArgumentError(f"Link: busy must be a dict of shares by collective, got "
                                       f"{type(self.busy).__name__}")
        for name, share in self.busy.items():
            if not (isinstance(share, (int, float)) and 0 <= share <= 1):
                raise InvalidArgumentError(f"Link: busy[{name!r}] must be in [0, 1], got {share!r}")

    def seconds(self, nbytes: float) -> float:
        """One message of ``nbytes``."""
        return self.latency + 8.0 * nbytes / (self.bits_per_second * self.efficiency)

    def of(self, collective: str) -> "Link":
        """The link as ``collective`` sees it."""
        fitted = self.fitted.get(collective) or self.fitted.get(collective.split("_fp16")[0])
        return Link(self.bits_per_second, *fitted, tree_all_reduce=self.tree_all_reduce, floors=self.floors,
                    busy=self.busy) if fitted else self

    def floor(self, collective: str) -> float:
        """The least seconds `collective` takes (0 where none was measured)."""
        return _by_kind(self.floors, collective)

    def computing(self, collective: str, seconds: float) -> float:
        """Of a collective's ``seconds``, those the transport computes on the processor."""
        return seconds * _by_kind(self.busy, collective)


def _by_kind(values: Dict[str, float], collective: str) -> float:
    """A collective's value, or its kind's (float16's all-reduce: the all-reduce's), or 0."""
    return values.get(collective, values.get(collective.split("_fp16")[0], 0.0))


def parse_rate(text: str) -> float:
    """Bits per second of a rate written as tc writes it: ``10gbit``, ``400mbit``."""
    m = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)(k|m|g|t)?bit", text.strip().lower())
    if not m:
        raise InvalidArgumentError(f"rate must be written like 10gbit or 400mbit, got {text!r}")
    return float(m[1]) * {None: 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}[m[2]]


def collective_seconds(link: Link, world: int, collective: str, nbytes: float) -> float:
    """Seconds one rank spends in ``collective`` of ``nbytes`` (for an all-gather, its own
    part; for an all-to-all, what it sends each other rank). ``all_reduce_fp16`` is an
    all-reduce of float16, which a link may have fitted apart."""
    if world == 1:
        return 0.0
    return max(link.floor(collective), _alpha_beta(link.of(collective), world, collective, nbytes))


def _alpha_beta(link: Link, w: int, collective: str, nbytes: float) -> float:
    """collective_seconds by the alpha-beta model of its algorithm alone."""
    if collective in ("all_reduce", "all_reduce_fp16"):  # a ring, or for few bytes among many ranks a tree (NCCL picks)
        ring = 2 * (w - 1) * link.seconds(nbytes / w)
        if not link.tree_all_reduce:
            return ring
        tree = 2 * math.ceil(math.log2(w)) * link.latency + 2 * (link.seconds(nbytes) - link.latency)
        return min(ring, tree)
    if collective == "reduce_scatter":
        return (w - 1) * link.seconds(nbytes / w)
    if collective in ("all_gather", "all_to_all"):
        return (w - 1) * link.seconds(nbytes)
    if collective == "broadcast":
        return math.ceil(math.log2(w)) * link.seconds(nbytes)
    raise InvalidArgumentError(f"collective must be all_reduce, all_reduce_fp16, reduce_scatter, all_gather, "
                               f"all_to_all or broadcast, got {collective!r}")


def count(density: float, n: int) -> int:
    """k of n at ``density``: ceil(density * n), at least 1 (docs/algorithms.md)."""
    k = math.ceil(density * n - 1e-9 * density * n)
    return min(n, max(1, k))


@dataclass(frozen=True)
class Bucket:
    """A DDP bucket: its floats, when backward has made it ready (seconds from the start
    of backward), and for PowerSGD the shapes of its matrices (rows, columns) and the
    floats of its vectors (1-D tensors, which PowerSGD sends whole)."""

    numel: int
    ready: float
    matrices: Tuple[Tuple[int, int], ...] = ()
    vector_floats: int = 0


@dataclass(frozen=True)
class Costs:
    """What a method costs on the processor, measured: its compression (and everything
    the hook does for a bucket that is not decoding) per bucket, in the buckets' order,
    and its decoding per entry received; the bytes of one entry of its messages."""

    compress: Tuple[float, ...]
    decode_per_entry: float = 0.0
    entry_bytes: float = 8.0


@dataclass(frozen=True)
class Workload:
    """One training step measured without communication: forward, backward (its
    buckets, ``Bucket.ready`` within it), the optimizer; and each method's costs."""

    forward: float
    backward: float
    optimizer: float
    buckets: Tuple[Bucket, ...]
    costs: Dict[str, Costs] = field(default_factory=dict)

    @property
    def numel(self) -> int:
        """The floats of every bucket."""
        return sum(b.numel for b in self.buckets)


def traffic(method: str, bucket: Bucket, world: int, density: float, entry_bytes: float = 8.0,
            min_compression_rate: float = 2.0):
    """(collectives as (name, bytes), entries decoded) of one bucket's exchange.
    ``min_compression_rate`` is PowerSGD's: a matrix is sent whole unless its factors are
    that many times smaller."""
    n = bucket.numel
    if method == "dense":
        return [("all_reduce", 4 * n)], 0
    if method == "fp16":
        return [("all_reduce_fp16", 2 * n)], 0
    m = re.fullmatch(r"powersgd(\d+)", method)
    if m:
        whole, p, q = bucket.vector_floats, 0, 0
        for rows, cols in bucket.matrices:
            rank = min(int(m[1]), rows, cols)
            if (rows + cols) * rank * min_compression_rate < rows * cols:  # as torch's hook decides
                p, q = p + rows * rank, q + cols * rank
            else:
                whole += rows * cols
        sent = [("all_reduce", 4 * whole), ("all_reduce", 4 * p), ("all_reduce", 4 * q)]
        return [c for c in sent if c[1] > 0], 0
    k = count(density, n)
    if method in ALLGATHER_METHODS:
        # A frame: the verdict, then the message padded to the bound the ranks agreed
        # from the last step's longest message (comm/frames.hpp, next_frame_bound: an
        # eighth more, rounded up to 64 bytes; here of the mean message, and without the
        # policies' largest message as its cap).
        message = math.ceil(MESSAGE_HEADER_BYTES + k * entry_bytes)
        bound = (message + message // 8 + 63) // 64 * 64
        return [("all_gather", VERDICT_BYTES + bound)], world * k
    if method == "scalecom":
        # The frames (the verdicts with the sizes the collectives move), the leader's
        # indices, then the values reduced to the leader and broadcast.
        sent = [("all_gather", FRAME_BYTES), ("broadcast", 4 * k), ("all_reduce", 4 * k), ("broadcast", 4 * k)]
        return sent, k
    if method == "sparse_allreduce":
        # The frames (the verdicts with the sizes the collectives move; the DDP hook's
        # settings ride in them), the entries in blocks of the room agreed (a header and
        # what a rank's selection sends each region's owner, an eighth more and 16), the
        # radix select's histograms, the ranks' records, the selection's parts (padded
        # alike to the largest).
        block = 8 * (1 + 9 * k / (8 * world) + 16)
        sent = [("all_gather", FRAME_BYTES), ("all_to_all", block)]
        sent += [("all_reduce", b) for b in RADIX_HISTOGRAM_BYTES]
        sent += [("all_gather", SPARSE_RECORD_BYTES), ("all_gather", 8 * (9 * k / (8 * world) + 16))]
        return sent, 2 * k
    raise InvalidArgumentError(f"method must be dense, fp16, powersgd<rank>, scalecom, sparse_allreduce or one of "
                               f"{', '.join(ALLGATHER_METHODS)}, got {method!r}")


@dataclass(frozen=True)
class Prediction:
    """A predicted step: its seconds; the step's computation without communication; the
    hook's computation (compression and decoding); the network's seconds in it."""

    method: str
    step: float
    computation: float
    hook_computation: float
    network: float

    @property
    def exposed(self) -> float:
        """What the step takes beyond its computation and the hook's: the network's
        seconds that backward did not hide."""
        return max(0.0, self.step - self.computation - self.hook_computation)


def predict(workload: Workload, method: str, world: int, link: Link, density: float = 0.001,
            min_compression_rate: float = 2.0) -> Prediction:
    """The step of ``method`` on ``world`` ranks joined by ``link`` (the schedule is the
    module's docstring's); ``density`` is the top-k methods', ``min_compression_rate``
    PowerSGD's."""
    if world < 1:
        raise InvalidArgumentError(f"predict: world must be >= 1, got {world}")
    if not 0 < density <= 1:
        raise InvalidArgumentError(f"predict: density must be in (0, 1], got {density}")
    buckets = workload.buckets
    costs = workload.costs.get(method)
    if costs is None:
        if method != "dense":
            raise InvalidArgumentError(f"predict: no measured costs for method {method!r} "
                                       f"(have {sorted(workload.costs)})")
        costs = Costs(compress=(0.0,) * len(buckets))
    if len(costs.compress) != len(buckets):
        raise InvalidArgumentError(f"predict: {method} has {len(costs.compress)} compression costs for "
                                   f"{len(buckets)} buckets")
    ready = [b.ready for b in buckets]
    if any(t < s for s, t in zip([0.0] + ready, ready + [workload.backward])):
        raise InvalidArgumentError("predict: buckets must be ready in order, within backward")
    exchanges = [traffic(method, b, world, density, costs.entry_bytes, min_compression_rate) for b in buckets]
    network, transport = [], []  # per bucket: the collectives' seconds, and the processor's among them
    for sent, _ in exchanges:
        seconds = [(c, collective_seconds(link, world, c, nbytes)) for c, nbytes in sent]
        network.append(sum(t for _, t in seconds))
        transport.append(sum(link.computing(c, t) for c, t in seconds))
    decode = [costs.decode_per_entry * entries for _, entries in exchanges]

    # The hook's work takes the processor when it is ready, and backward goes on in the
    # gaps (it is thousands of small operations; the hook's interleave with them). The
    # hook's buckets go one after another, so the network carries one bucket at a time.
    clock, done = 0.0, 0.0  # done: backward's computation so far
    boundaries = ready + [workload.backward]  # backward's progress when each bucket is ready
    reached = 0  # buckets ready
    queue = []  # (ready, kind, bucket) of the hook's work that can run
    finished = 0  # buckets whose hook has finished
    while True:
        task_at = min(queue)[0] if queue else math.inf
        boundary_at = clock + boundaries[reached] - done if reached < len(boundaries) else math.inf
        if task_at == boundary_at == math.inf:
            break
        if task_at <= clock:
            queue.remove(task := min(queue))
            _, kind, i = task
            if kind == "compress":
                clock += costs.compress[i]
                queue.append((clock + network[i], "decode", i))
                queue.append((clock, "transport", i))  # its share of the processor, at once
            elif kind == "transport":
                clock += transport[i]
            else:
                clock += decode[i]
                finished = i + 1
                if finished < min(reached, len(buckets)):
                    queue.append((clock, "compress", finished))
        elif boundary_at <= task_at:
            clock, done = boundary_at, boundaries[reached]
            if reached < len(buckets) and reached == finished:
                queue.append((clock, "compress", reached))
            reached += 1
        else:  # backward computes until the hook's next work is ready
            if reached < len(boundaries):
                done += task_at - clock
            clock = task_at
    computation = workload.forward + workload.backward + workload.optimizer
    return Prediction(method, workload.forward + clock + workload.optimizer, computation,
                      sum(costs.compress) + sum(decode) + sum(transport), sum(network))


def load(path: str) -> Workload:
    """A workload from a JSON file of seconds::

        {"forward": 0.02, "backward": 0.04, "optimizer": 0.003,
         "buckets": [{"numel": 6500000, "ready": 0.012,
                      "matrices": [[768, 3072]], "vector_floats": 3840}, ...],
         "costs": {"topk_ef": {"compress": [0.0004, ...], "decode_per_entry": 2e-10,
                               "entry_bytes": 8}, "fp16": {"compress": [...]}, ...}}

    ``buckets`` in the order DDP makes them ready; ``ready`` from the start of backward;
    ``matrices`` and ``vector_floats`` only matter for PowerSGD."""
    with open(path) as f:
        data = json.load(f)
    try:
        buckets = tuple(Bucket(int(b["numel"]), float(b["ready"]), tuple(tuple(m) for m in b.get("matrices", ())),
                               int(b.get("vector_floats", 0))) for b in data["buckets"])
        costs = {name: Costs(tuple(float(c) for c in v["compress"]), float(v.get("decode_per_entry", 0.0)),
                             float(v.get("entry_bytes", 8.0))) for name, v in data.get("costs", {}).items()}
        return Workload(float(data["forward"]), float(data["backward"]), float(data["optimizer"]), buckets, costs)
    except (KeyError, TypeError, ValueError) as e:
        raise InvalidArgumentError(f"load: {path} is not a workload (see gradcomp.plan.load): {e!r}") from None


def plan(workload: Workload, world: int, link: Link, methods: Sequence[str] = (),
         densities: Sequence[float] = (0.01, 0.001), min_compression_rate: float = 2.0) -> List[Tuple[str, float,
                                                                                                        Prediction]]:
    """Every method with measured costs (or ``methods``), at each density for the top-k
    methods: (method, density or 0, prediction), the fastest step first. Dense is always
    among them: the baseline."""
    names = list(methods) or ["dense", *sorted(workload.costs)]
    if "dense" not in names:
        names.insert(0, "dense")
    rows = []
    for name in names:
        sparse = name not in ("dense", "fp16") and not name.startswith("powersgd")
        for d in densities if sparse else (0.0,):
            rows.append((name, d, predict(workload, name, world, link, d or 0.001, min_compression_rate)))
    return sorted(rows, key=lambda r: r[2].step)


def _table(workload: Workload, world: int, link: Link, args) -> str:
    rows = plan(workload, world, link, args.methods, args.density, args.min_compression_rate)
    dense = next(p.step for name, _, p in rows if name == "dense")
    lines = [f"W = {world}, {link.bits_per_second / 1e9:g} Gbit/s: step without communication "
             f"{rows[0][2].computation * 1e3:.1f} ms",
             "| method | density | step (ms) | speedup over dense | network (ms) | hook's computation (ms) |",
             "|---|---:|---:|---:|---:|---:|"]
    for name, d, p in rows:
        lines.append(f"| {name} | {d or '-'} | {p.step * 1e3:.1f} | {dense / p.step:.2f}x | {p.network * 1e3:.1f} | "
                     f"{p.hook_computation * 1e3:.1f} |")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> None:
    """``python -m gradcomp.plan``: the plan's table for each world size and link."""
    parser = argparse.ArgumentParser(prog="python -m gradcomp.plan", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("workload", help="JSON of measured seconds (gradcomp.plan.load)")
    parser.add_argument("--world", default="8,32,128", help="world sizes, comma-separated")
    parser.add_argument("--link", default="10gbit,25gbit,100gbit,400gbit", help="link rates, comma-separated")
    parser.add_argument("--latency", type=float, default=10e-6, help="seconds per message (alpha)")
    parser.add_argument("--efficiency", type=float, default=0.9, help="share of the rate payload gets")
    parser.add_argument("--density", type=lambda s: [float(x) for x in s.split(",")], default=[0.01, 0.001],
                        help="densities of the top-k methods, comma-separated")
    parser.add_argument("--methods", type=lambda s: s.split(","), default=[],
                        help="methods (default: dense and every method the workload has costs for)")
    parser.add_argument("--min-compression-rate", type=float, default=2.0, help="PowerSGD's (torch's default 2)")
    args = parser.parse_args(argv)
    workload = load(args.workload)
    for world in (int(w) for w in args.world.split(",")):
        for rate in args.link.split(","):
            print(_table(workload, world, Link(parse_rate(rate), args.latency, args.efficiency), args), end="\n\n")


if __name__ == "__main__":
    main()
