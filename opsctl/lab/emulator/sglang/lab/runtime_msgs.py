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
