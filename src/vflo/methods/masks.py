"""Random orthogonal masks, dense or block-diagonal, as FedSVD and VFL-ASP use them.

A dense m x m mask costs m² numbers to send and m³ to make; a block-diagonal mask
with blocks of size b costs m·b and m·b², which is what makes federated SVD over
tens of thousands of rows feasible. Blocks travel as one (k, b, b) stack plus a
last block that takes the remainder (between b and 2b - 1 rows), so none is smaller than b.

A party takes masks from the dealer only after ``OrthogonalMask.check_strength`` under its policy's
``min_mask_block`` and ``min_mask_mixing``: blocks large enough, orthogonal, and mixing every row and column
of each block over many inputs, as a random block does and an identity or a permutation does not.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vflo.comm.message import Payload
from vflo.errors import ConfigError, ProtocolError


def block_layout(n: int, block_size: int | None) -> tuple[int, int]:
    """How :meth:`OrthogonalMask.random` lays out ``n`` rows: ``k`` blocks of ``block_size`` and a last block of
    ``r`` rows (the remainder folded in, so it is never smaller than a block); ``k = 0``: one dense ``n x n``."""
    if block_size is None or block_size >= n:
        return 0, n
    k, r = divmod(n, block_size)
    if r:
        k, r = k - 1, block_size + r
    return (k, r) if k else (0, n)


def random_orthogonal(n: int, rng: np.random.Generator, dtype: str = "float64") -> np.ndarray:
    """A Haar-random n x n orthogonal matrix (QR of a Gaussian, signs fixed by R's diagonal)."""
    if n == 0:
        return np.zeros((0, 0), dtype=dtype)
    q, r = np.linalg.qr(rng.standard_normal((n, n)))
    q *= np.sign(np.diag(r))
    return q.astype(dtype, copy=False)


# How much a Haar-random b x b block mixes, at worst, over its b rows and b columns: the participation ratio
# PR(x) = (sum_j x_j^2)^2 / sum_j x_j^4 of a row x (1 / sum_j x_j^4 for a unit row: the effective number of inputs
# mixed into one output; about (b + 2) / 3 on average, 1 for a row of a signed permutation). A block must reach
# required_mixing(b, min_mixing) = min(min_mixing, max(MIXING_PER_SIZE * b, 1 + (1e-7 / b^2)^(2 / (b - 1)))).
#
# Calibration. A row of a Haar block is uniform on the sphere: x_1^2 = s ~ Beta(1/2, (b-1)/2), the rest sqrt(1-s) u
# with u uniform on S^(b-2), so P(row PR < t) = b E_u[P_s(x_1 the largest, s^2 + (1-s)^2 sum u^4 > 1/t)], exact in s
# and Monte Carlo in u only, which resolves tails far below what sampling blocks can; a block's smallest PR is below
# t with probability at most 2b P(row PR < t) (a union over rows and columns). Sampling Haar blocks directly (b = 3,
# 8, 16, 40, 100, 400; 2e3 to 2e6 blocks each) put their 1e-2, 1e-3 and 1e-4 quantiles where b P(row PR < t) says,
# so the 2b bound overstates the tail about twice. t_b, where that bound is 1e-6, from (numpy 2, scipy 1.17):
#
#     import numpy as np; from scipy.stats import beta
#     def t_b(b, p=1e-6, n=4000, rng=np.random.default_rng(0)):
#         g = rng.standard_normal((n, b - 1)) ** 2; u = g / g.sum(1, keepdims=True)
#         U, s0, B, lo, hi = (u * u).sum(1), u.max(1) / (1 + u.max(1)), beta(0.5, (b - 1) / 2), 1.0, (b + 2) / 3
#         for _ in range(60):
#             t = (lo + hi) / 2; d = (1 + U) / t - U; q = np.sqrt(np.maximum(d, 0))
#             up, dn = (U + q) / (1 + U), (U - q) / (1 + U)
#             P = np.where(d <= 0, B.sf(s0), B.sf(np.maximum(up, s0)) + np.maximum(B.cdf(dn) - B.cdf(s0), 0)).mean()
#             lo, hi = (lo, t) if 2 * b * b * P > p else (t, hi)
#         return lo
#
#     b      2        3         4         8       16      24      32      38      40      64      128     512    2000
#     t_b    1+2e-13  1+2.2e-7  1+3.5e-5  1.0139  1.192   1.511   1.911   2.251   2.371   4.044   10.14   74.2   457
#     t_b/b  0.500    0.333     0.250     0.127   0.0745  0.0629  0.0597  0.0592  0.0593  0.0632  0.0792  0.145  0.228
#
# Every b from 25 to 60 solved, the smallest t_b / b is 0.0592 (b = 38), hence MIXING_PER_SIZE = 0.05. Below b = 23
# the floor 1 + (1e-7 / b^2)^(2/(b-1)) takes over (the tail there goes as b^2 eps^((b-1)/2) in eps = t - 1), so an
# exact identity or permutation is refused at every block size from 2 on. With both, the bound on refusing a Haar
# block is at most 9.3e-8 at every b from 2 to 2000 (checked at every b to 200, then every 40 to 1000 and every 100
# to 2000; largest at b = 2; 2.6e-8 at 40, 1.3e-8 at 64, 1.1e-9 at 100, 1.7e-12 at 200). The largest-entry rule
# (an entry above 0.95 from b = 17 on) refuses a Haar block with probability b^2 P(Beta(1/2, (b-1)/2) > 0.95^2):
# 1.4e-6 at b = 16, 4.9e-7 at 17, 1.9e-8 at 20, 3e-13 at 30.
MIXING_PER_SIZE = 0.05
MAX_ENTRY = 0.95
MAX_ENTRY_FROM = 17  # 1.4e-6 of honest 16 x 16 blocks would pass 0.95; from 17 on, under 5e-7
_FLOOR_TAIL = 1e-7
_CHUNK = 1 << 22  # entries per batch of blocks checked at once


def required_mixing(b: int, min_mixing: float) -> float:
    """The participation ratio every row and column of a b x b mask block must reach under ``min_mixing``."""
    if b < 2:
        return 1.0
    floor = 1.0 + float((_FLOOR_TAIL / b**2) ** (2.0 / (b - 1)))
    return min(float(min_mixing), max(MIXING_PER_SIZE * b, floor))


@dataclass(frozen=True)
class OrthogonalMask:
    """A block-diagonal orthogonal matrix: ``blocks`` (k, b, b) then ``tail`` (r, r); dense when k = 0."""

    blocks: np.ndarray
    tail: np.ndarray

    @classmethod
    def random(cls, n: int, block_size: int | None, rng: np.random.Generator,
               dtype: str = "float64") -> OrthogonalMask:
        """Dense when ``block_size`` is None or at least ``n``. Otherwise blocks of ``block_size`` and the
        remainder folded into a larger last block (``block_size + n % block_size``), so that no block is ever
        smaller than ``block_size``: a 1 x 1 block would pass its row through up to its sign."""
        if block_size is not None and block_size < 1:
            raise ConfigError(f"block_size must be positive, got {block_size}")
        k, r = block_layout(n, block_size)
        if k == 0:
            return cls(np.zeros((0, 0, 0), dtype=dtype), random_orthogonal(n, rng, dtype))
        assert block_size is not None
        blocks = np.stack([random_orthogonal(block_size, rng, dtype) for _ in range(k)])
        return cls(blocks, random_orthogonal(r, rng, dtype))

    @property
    def size(self) -> int:
        return int(self.blocks.shape[0] * self.blocks.shape[1] + self.tail.shape[0])

    def check_strength(self, what: str, *, min_block: int = 2, min_mixing: float = 8.0) -> None:
        """Refuse (ProtocolError) a mask that would hide too little, under a party's policy bounds
        (``[policy]`` min_mask_block and min_mask_mixing; the defaults here are the weakest block size a policy
        accepts and its default mixing). A mask passes only when each of its blocks of size b

        - is at least ``min(min_block, size)`` (a dense mask of fewer rows is one block of its size);
        - is orthogonal (unit rows and columns, and M M^T v = v on random probes drawn here);
        - from b = 17 on, has no entry above 0.95 in absolute value;
        - mixes: every row and every column has a participation ratio (sum_j M_ij^2)^2 / sum_j M_ij^4 of at least
          ``required_mixing(b, min_mixing) = min(min_mixing, max(0.05 b, 1 + (1e-7 / b^2)^(2/(b-1))))``.

        So a released row (and, for column masks, column) is a combination of at least that many inputs with
        comparable weight, and, in blocks of 17 rows or more, no input weighs more than 0.95 in it. An identity
        or a signed permutation (at any block size, in 1 x 1 blocks or one dense block), a permutation or
        block-diagonal matrix inside a large block (its exact zeros leave each row few inputs), a mask whose
        rows are partly unit vectors, and a rotation near a permutation are refused. A Haar-random block, as
        ``random`` deals, is refused with probability at most 1e-7 by the mixing bound, at any b from 2 to 2000
        (see the calibration above; the 0.95 rule, from b = 17 on, adds under 5e-7). Small
        blocks stay weak however random they are: what protects rows is ``min_block``; min_mixing = 1 turns the
        mixing check off."""
        need = min(int(min_block), self.size)
        k, b = self.blocks.shape[0], self.blocks.shape[1]
        total = k + (1 if self.tail.shape[0] else 0)
        per = max(1, _CHUNK // max(1, b * b))
        for first in range(0, k, per):
            _check_blocks(what, self.blocks[first : first + per], first, total, need, min_block, min_mixing)
        if self.tail.shape[0]:
            _check_blocks(what, self.tail[None], k, total, need, min_block, min_mixing)

    def _split(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if X.shape[0] != self.size:
            raise ProtocolError(f"mask of size {self.size} cannot multiply a matrix with {X.shape[0]} rows")
        k, b = self.blocks.shape[0], self.blocks.shape[1]
        return X[: k * b].reshape(k, b, *X.shape[1:]), X[k * b :]

    def left(self, X: np.ndarray) -> np.ndarray:
        """M @ X without forming M."""
        head, rest = self._split(X)
        top = np.einsum("kij,kj...->ki...", self.blocks, head).reshape(-1, *X.shape[1:])
        return np.concatenate([top, self.tail @ rest], axis=0)

    def left_t(self, X: np.ndarray) -> np.ndarray:
        """M.T @ X without forming M."""
        head, rest = self._split(X)
        top = np.einsum("kji,kj...->ki...", self.blocks, head).reshape(-1, *X.shape[1:])
        return np.concatenate([top, self.tail.T @ rest], axis=0)

    def right(self, X: np.ndarray) -> np.ndarray:
        """X @ M."""
        return self.left_t(X.T).T

    def dense(self) -> np.ndarray:
        return self.left(np.eye(self.size, dtype=self.tail.dtype))

    def to_payload(self, prefix: str) -> Payload:
        return {f"{prefix}_blocks": self.blocks, f"{prefix}_tail": self.tail}

    @classmethod
    def from_payload(cls, payload: Payload, prefix: str) -> OrthogonalMask:
        blocks, tail = payload[f"{prefix}_blocks"], payload[f"{prefix}_tail"]
        if not (isinstance(blocks, np.ndarray) and isinstance(tail, np.ndarray)):
            raise ProtocolError(f"mask {prefix!r} must be sent as arrays")
        if blocks.ndim != 3 or blocks.shape[1] != blocks.shape[2] or tail.ndim != 2 or tail.shape[0] != tail.shape[1]:
            raise ProtocolError(f"mask {prefix!r} has malformed shapes {blocks.shape} and {tail.shape}")
        return cls(blocks, tail)


def _check_blocks(what: str, stack: np.ndarray, first: int, total: int, need: int, min_block: int,
                  min_mixing: float) -> None:
    """OrthogonalMask.check_strength on a (c, b, b) stack of its blocks, the first of them block ``first``."""
    b = stack.shape[1]

    def name(i: int) -> str:
        return f"{what}: mask block {first + i + 1} of {total}, of size {b},"

    if b < need:
        raise ProtocolError(f"{name(0)} is smaller than this party's policy allows (blocks of {need} rows at least: "
                            f"min_mask_block = {min_block}, or the whole mask when it is smaller); a small block "
                            "passes its rows through nearly in the clear; refused")
    if b == 0:
        return
    if stack.dtype.kind not in "fiu":
        raise ProtocolError(f"{name(0)} is not a real matrix (dtype {stack.dtype}); refused")
    M = np.asarray(stack, dtype=np.float64)
    largest = np.abs(M).max(axis=(1, 2))
    bounded = largest <= 1.0 + 1e-3  # no entry of an orthogonal matrix is above 1; also false for nan and inf
    if not bounded.all():
        raise ProtocolError(f"{name(int(np.argmin(bounded)))} is not orthogonal (an entry is above 1 or not "
                            "finite); refused")
    M2 = M * M
    rows, cols = M2.sum(axis=2), M2.sum(axis=1)
    # M M^T v = v on 4 vectors the dealer cannot know in advance (c b^2 work), and unit rows and columns
    probe = np.random.default_rng().standard_normal((b, 4))
    back = np.einsum("cij,cjp->cip", M, np.einsum("cji,jp->cip", M, probe))
    close = np.abs(back - probe).max(axis=(1, 2)) <= 1e-3 * max(1.0, float(np.abs(probe).max()))
    unit = ((np.abs(rows - 1.0) <= 1e-3) & (np.abs(cols - 1.0) <= 1e-3)).all(axis=1)
    if not (orthogonal := close & unit).all():
        raise ProtocolError(f"{name(int(np.argmin(orthogonal)))} is not orthogonal; refused")
    if b >= MAX_ENTRY_FROM and (largest > MAX_ENTRY).any():
        i = int(np.argmax(largest))
        raise ProtocolError(f"{name(i)} passes an input nearly in the clear (an entry of {largest[i]:.3f}, above "
                            f"{MAX_ENTRY} from blocks of {MAX_ENTRY_FROM} rows on): it is (nearly) an identity or a "
                            "permutation; refused")
    required = required_mixing(b, min_mixing)
    M4 = M2 * M2
    mixing = np.minimum((rows * rows / M4.sum(axis=2)).min(axis=1), (cols * cols / M4.sum(axis=1)).min(axis=1))
    if (mixing < required).any():
        i = int(np.argmin(mixing))
        raise ProtocolError(f"{name(i)} hides too little: one of its rows or columns mixes only {mixing[i]:.3g} "
                            f"inputs (participation ratio), below the {required:.3g} this party's policy requires "
                            f"(min_mask_mixing = {min_mixing}, or less for a small block: what a random block of "
                            "its size surely reaches); an identity, a permutation, or zeros that split the block "
                            "leave rows unmixed; refused")
