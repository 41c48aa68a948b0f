"""`python -m sglang.launch_server <SGLang 0.5.23 flags>` (lab emulator)."""
from sglang.lab.main import main

if __name__ == "__main__":
    main()
