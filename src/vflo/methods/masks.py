"""Random orthogonal masks, dense or block-diagonal, as FedSVD and VFL-ASP use them.

A dense m x m mask costs m² numbers to send and m³ to make; a block-diagonal mask
with blocks of size b costs m·b and m·b², which is what makes federated SVD over
tens of thousands of rows feasible. Blocks travel as one (k, b, b) stack plus a
smaller tail block for the remainder.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vflo.comm.message import Payload
from vflo.errors import ConfigError, ProtocolError


def random_orthogonal(n: int, rng: np.random.Generator, dtype: str = "float64") -> np.ndarray:
    """A Haar-random n x n orthogonal matrix (QR of a Gaussian, signs fixed by R's diagonal)."""
    if n == 0:
        return np.zeros((0, 0), dtype=dtype)
    q, r = np.linalg.qr(rng.standard_normal((n, n)))
    q *= np.sign(np.diag(r))
    return q.astype(dtype, copy=False)


@dataclass(frozen=True)
class OrthogonalMask:
    """A block-diagonal orthogonal matrix: ``blocks`` (k, b, b) then ``tail`` (r, r); dense when k = 0."""

    blocks: np.ndarray
    tail: np.ndarray

    @classmethod
    def random(cls, n: int, block_size: int | None, rng: np.random.Generator,
               dtype: str = "float64") -> OrthogonalMask:
        """Dense when ``block_size`` is None or at least ``n``."""
        if block_size is not None and block_size < 1:
            raise ConfigError(f"block_size must be positive, got {block_size}")
        if block_size is None or block_size >= n:
            return cls(np.zeros((0, 0, 0), dtype=dtype), random_orthogonal(n, rng, dtype))
        k, r = divmod(n, block_size)
        blocks = np.stack([random_orthogonal(block_size, rng, dtype) for _ in range(k)])
        return cls(blocks, random_orthogonal(r, rng, dtype))

    @property
    def size(self) -> int:
        return int(self.blocks.shape[0] * self.blocks.shape[1] + self.tail.shape[0])

    def check_strength(self, what: str) -> None:
        """Refuse a mask that would hide nothing: one not orthogonal, or (from 8 rows on) one most of whose rows
        are nearly unit vectors, as an identity or a permutation is. A random orthogonal matrix of that size
        almost never has even one such row, so a dealer that follows the protocol is never refused."""
        for M in (*self.blocks, self.tail):
            n = M.shape[0]
            if n == 0:
                continue
            M64 = np.asarray(M, dtype=np.float64)
            probe = np.random.default_rng(n).normal(size=(n, 4))  # M M^T = I, checked on 4 vectors: n^2 work
            if not np.allclose(M64 @ (M64.T @ probe), probe, atol=1e-3 * max(1.0, float(np.abs(probe).max()))):
                raise ProtocolError(f"{what}: a mask block of size {n} is not orthogonal; refused")
            if n >= 8 and (np.abs(M64).max(axis=1) > 0.99).mean() > 0.5:
                raise ProtocolError(f"{what}: a mask block of size {n} is (nearly) an identity or a permutation, "
                                    "which would reveal the rows it should hide; refused")

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
