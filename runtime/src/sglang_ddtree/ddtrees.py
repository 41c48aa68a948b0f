"""The draft-tree container (:class:`DDTrees`) and the depth tie-break.

The bottom of the package: imported by the builders (``tree``, the Triton
kernels), the verify tensors and the worker; imports nothing of the package.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["DDTrees", "DEPTH_EPS"]

# Depth tie-break in the global selection: among (numerically) equal scores
# prefer the shallower prefix so the selected set stays prefix-closed even if
# a log-probability rounds to exactly 0.  Far below float32 resolution of the
# scores, far above float64 resolution.
DEPTH_EPS = 1e-9


@dataclass
class DDTrees:
    """A batch of draft trees, static shape ``[bs, N]`` with ``N = budget + 1``.

    tokens:     int64 [bs, N]  token id per node; node 0 = root (``root_tokens``
                or 0), padding nodes 0.
    parents:    int64 [bs, N]  parent node index; root and padding: -1.
    depths:     int64 [bs, N]  root 0, node at depth d: d; padding 0.
    visibility: bool  [bs, N, N] ``visibility[b, i, j]``: node j is i or an
                ancestor of i.  Padding rows and columns are all False.
    valid:      bool  [bs, N]  real node (root included).
    """

    tokens: torch.Tensor
    parents: torch.Tensor
    depths: torch.Tensor
    visibility: torch.Tensor
    valid: torch.Tensor

    @property
    def batch_size(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def num_nodes(self) -> torch.Tensor:
        """[bs] number of real nodes including the root (device tensor)."""
        return self.valid.sum(-1)

    def paths(self, b: int) -> set:
        """Root-to-node token paths of request ``b`` (host sync; tests only)."""
        toks = self.tokens[b].tolist()
        par = self.parents[b].tolist()
        val = self.valid[b].tolist()
        memo = {0: ()}
        out = set()
        for i in range(1, len(toks)):
            if not val[i]:
                continue
            memo[i] = memo[par[i]] + (toks[i],)
            out.add(memo[i])
        return out
