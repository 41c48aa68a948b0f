"""sglang-ddtree: DDTree (block-diffusion draft trees) for SGLang 0.5.23.

Public API:
  build_trees(draft_logits[bs, L, V], budget) -> DDTrees   (batched, static shape)
  reference.build_tree(draft_logits[L, V], budget)          (heap reference)
  verify.build_verify_inputs / verify.greedy_accept / verify.sample_accept
  plugin.register                                            (SGLang entry point)
"""

__version__ = "0.1.0"

from .tree import DDTrees, build_trees, build_trees_from_top  # noqa: E402

__all__ = ["DDTrees", "build_trees", "build_trees_from_top", "__version__"]
