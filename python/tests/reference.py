"""Plain NumPy references for the tests: nothing here calls gradcomp."""
import numpy as np


def k_for(density, n):
    """The entries a density names (docs/algorithms.md): the smallest k in [1, n] with
    k / n >= density, the quotient rounded to double (Python's true division)."""
    low, high = 1, n
    while low < high:
        mid = (low + high) // 2
        if mid / n >= density:
            high = mid
        else:
            low = mid + 1
    return low


def top_k(x, k):
    """The k entries of largest |x|, ties to the lower index, ascending."""
    x = np.asarray(x, dtype=np.float64)
    order = np.lexsort((np.arange(len(x)), -np.abs(x)))  # by |x| descending, then index
    return np.sort(order[:k]).astype(np.int64)


def stored_in_blocks(x, bits, block):
    """x as a compact memory stores it (docs/algorithms.md, "Compressed memory"): per
    block the smallest power of two 2^E (E in [-127, 127]) with max |x| <= L 2^E, L =
    2^(bits-1) - 1; in index order, y = x_i + carry (float32), q = clamp(round half to
    even(y / 2^E), -L, L), carry = y - q 2^E; the stored values q 2^E."""
    x = np.asarray(x, dtype=np.float32)
    limit = 2 ** (bits - 1) - 1
    out = np.empty_like(x)
    for begin in range(0, len(x), block):
        part = x[begin:begin + block]
        m = float(np.max(np.abs(part)))
        e = -127
        while e < 127 and m > limit * 2.0 ** e:
            e += 1
        scale = np.float32(2.0 ** e)
        carry = np.float32(0.0)
        for j, v in enumerate(part):
            y = np.float32(v + carry)
            q = min(max(np.round(np.float64(y) / np.float64(scale)), -limit), limit)  # np.round: half to even
            out[begin + j] = np.float32(q) * scale
            carry = np.float32(y - out[begin + j])
    return out


class TopkErrorFeedback:
    """e <- e + g; send the top-k of e; e_i <- 0 where sent; with `stored` (bits,
    block), e is then stored in blocks."""

    def __init__(self, n, stored=None):
        self.e = np.zeros(n, dtype=np.float32)
        self.stored = stored

    def step(self, g, k):
        self.e = (self.e + g).astype(np.float32)
        idx = top_k(self.e, k)
        values = self.e[idx].copy()
        self.e[idx] = 0.0
        if self.stored is not None:
            self.e = stored_in_blocks(self.e, *self.stored)
        return idx, values


class DgcExactTopk:
    """DGC with exact top-k: clip to max_norm, momentum correction with masking, f16 values."""

    def __init__(self, n, beta=0.9, max_norm=np.inf):
        self.u = np.zeros(n, dtype=np.float32)
        self.v = np.zeros(n, dtype=np.float32)
        self.beta = np.float32(beta)
        self.max_norm = max_norm

    def step(self, g, k):
        norm = np.sqrt(np.sum(g.astype(np.float64) ** 2))
        scale = np.float32(self.max_norm / norm) if norm > self.max_norm else np.float32(1.0)
        g = (g * scale).astype(np.float32)
        self.u = (self.beta * self.u + g).astype(np.float32)
        self.v = (self.v + self.u).astype(np.float32)
        idx = top_k(self.v, k)
        sent = self.v[idx].astype(np.float16).astype(np.float32)
        self.v[idx] -= sent
        self.u[idx] = 0.0
        return idx, sent


def adacomp(acc, g, bin_size):
    """AdaComp's rule: i where |acc_i + g_i| >= max |acc| of its bin."""
    h = acc + g
    out = []
    for start in range(0, len(acc), bin_size):
        top = np.max(np.abs(acc[start:start + bin_size]))
        out.extend(i for i in range(start, min(start + bin_size, len(acc))) if abs(h[i]) >= top)
    return np.array(out, dtype=np.int64)


class GlobalTopk:
    """Ok-Topk's global top-k with error feedback for W ranks (docs/algorithms.md,
    "Global top-k"): each rank e <- e + g and its top-k; the sums per index in rank
    order (float32); the k of largest |sum|, ties to the lower index; each rank's e
    loses what it sent only where the global selection kept it."""

    def __init__(self, world, n):
        self.e = [np.zeros(n, dtype=np.float32) for _ in range(world)]

    def step(self, grads, k_rank, k):
        n = len(self.e[0])
        sums = np.zeros(n, dtype=np.float32)
        seen = np.zeros(n, dtype=bool)
        chosen, sent = [], []
        for r, g in enumerate(grads):
            self.e[r] = (self.e[r] + g).astype(np.float32)
            idx = top_k(self.e[r], k_rank)
            values = self.e[r][idx].copy()
            sums[idx] = np.where(seen[idx], (sums[idx] + values).astype(np.float32), values)  # in rank order
            seen[idx] = True
            chosen.append(idx)
            sent.append(values)
        union = np.nonzero(seen)[0]
        selected = union[top_k(sums[union], k)] if len(union) else union
        for r in range(len(grads)):
            kept = np.isin(chosen[r], selected)
            self.e[r][chosen[r][kept]] = (self.e[r][chosen[r][kept]] - sent[r][kept]).astype(np.float32)
        return selected, sums[selected]


class LeaderSgd:
    """Leader SGD of W workers in one process (docs/algorithms.md, "Leader SGD"), in
    float32 element by element: ``step(losses)`` after every worker's local step, with
    each worker's mean recent loss; with ``density`` the leaders send their changes
    against a reference (one per group, one global) by top-k, the parameters whole at the
    first round of each kind."""

    def __init__(self, x, period, global_every, local_pull, global_pull, group_size=0, density=None):
        self.x = [np.asarray(v, dtype=np.float32).copy() for v in x]
        self.period, self.global_every = period, global_every
        self.c1, self.c2 = np.float32(local_pull), np.float32(global_pull)
        self.g = group_size or len(self.x)
        self.density = density
        self.t = 0
        self.group_ref = [None] * (len(self.x) // self.g)
        self.global_ref = [None]

    def _toward(self, refs, which, leader):
        """What the workers are pulled toward: the leader's parameters, or the reference
        as the leader's compressed change moves it."""
        if self.density is None:
            return self.x[leader].copy()
        if refs[which] is None:
            refs[which] = self.x[leader].copy()
        else:
            change = (self.x[leader] - refs[which]).astype(np.float32)
            idx = top_k(change, k_for(self.density, len(change)))
            refs[which][idx] = (refs[which][idx] + change[idx]).astype(np.float32)
        return refs[which]

    def _pull(self, ranks, leader, target, c):
        for r in ranks:
            if r != leader:
                self.x[r] = (self.x[r] - c * (self.x[r] - target)).astype(np.float32)

    def step(self, losses):
        """Returns (group leader of each worker, global leader) at a round, else None."""
        self.t += 1
        if self.t % self.period:
            return None
        w = len(self.x)
        lowest = lambda ranks: min(ranks, key=lambda r: (losses[r], r))  # noqa: E731
        leaders = [None] * w
        for first in range(0, w, self.g):
            ranks = range(first, first + self.g)
            leader = lowest(ranks)
            target = self._toward(self.group_ref, first // self.g, leader)
            self._pull(ranks, leader, target, self.c1)
            for r in ranks:
                leaders[r] = leader
        top = -1
        if (self.t // self.period) % self.global_every == 0:
            top = lowest(range(w))
            self._pull(range(w), top, self._toward(self.global_ref, 0, top).copy(), self.c2)
        return leaders, top
