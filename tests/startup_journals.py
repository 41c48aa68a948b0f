"""A real server's start on the clock, for the start-up tests: systemd's view of SGLang 0.5.23's
lines with timestamps (an AR profile; every figure from the timestamps except SGLang's own
elapsed fields)."""
from __future__ import annotations


def clock_journal(load_s: int = 36, warm_s: int = 180) -> str:
    t = [0]

    def at(dt):
        t[0] += dt
        m, s = divmod(t[0], 60)
        return f"2026-12-01 10:{m:02d}:{s:02d}"

    return "\n".join([
        f"[{at(0)}] server_args=ServerArgs(model_path='/srv/m', tp_size=8)",
        f"[{at(5)} TP0] Load weight begin. avail mem=94.61 GB",
        f"[{at(load_s)} TP0] Load weight end. elapsed={load_s}.00 s, type=X, avail mem=21.00 GB, mem usage=73.61 GB.",
        f"[{at(1)} TP0] Capture target decode CUDA graph begin. backend=full, num_tokens_per_req=1, avail mem=13.07 GB",
        f"[{at(200)} TP0] Capture target decode CUDA graph end. bs=[1, 2, 4], elapsed=200.00 s, mem usage=0.5 GB, "
        "avail mem=12.5 GB.",
        f"[{at(2)}] INFO:     Uvicorn running on http://0.0.0.0:30000 (Press CTRL+C to quit)",
        f"[{at(warm_s)}] The server is fired up and ready to roll!"])
