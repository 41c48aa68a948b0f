"""Messages copied from SGLang 0.5.23 (srt/model_executor/runner_backend_utils/__init__.py)."""

CAPTURE_FAILED_HINTS = (
    "Possible solutions:\n"
    "1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)\n"
    "2. set --cuda-graph-max-bs-decode to a smaller value (e.g., 16)\n"
    "3. disable decode CUDA graph by --cuda-graph-backend-decode=disabled. "
    "(Not recommended. Huge performance loss)\n"
    "Open an issue on GitHub https://github.com/sgl-project/sglang/issues/new/choose \n"
)

# The DDTree runtime's line per draft-head specialisation it compiles (Triton) at start-up, on TP0,
# between the draft graph's capture begin and end (the compile runs inside that capture, so the
# capture's `elapsed=` includes it). NOT printed by runtime/src yet: issue 36's runtime work prints
# exactly this; opsctl.startup parses it. A specialisation found in the release's Triton cache
# (TRITON_CACHE_DIR with opsctl-triton-manifest.json) is not compiled and prints nothing.
DDTREE_COMPILE = ("DDTREE Triton compile: budget={budget}, block={block}, vocab_shard={vocab_shard}, "
                  "arch={arch}, elapsed={elapsed:.2f} s, cache={cache}")

# The DDTree runtime's step line (runtime/src/sglang_ddtree/stepparts.py), on TP0 every
# SGLANG_DDTREE_STEP_PARTS_EVERY decode steps (default 200; 0: off), one per (bs, budget) the window
# sampled: medians of the step's parts in ms. opsctl.onhost.diagnosis parses it.
DDTREE_STEP_PARTS = ("DDTree step parts: bs={bs} budget={budget} sampled={sampled} of={of} drafter_ms={drafter_ms:.3f} "
                     "tree_ms={tree_ms:.3f} prep_ms={prep_ms:.3f} target_ms={target_ms:.3f} commit_ms={commit_ms:.3f} "
                     "step_ms={step_ms:.3f}")
STEP_PARTS_EVERY_ENV = "SGLANG_DDTREE_STEP_PARTS_EVERY"
STEP_PARTS_EVERY_DEFAULT = 200
