"""opsctl: put speculative-decoding SGLang releases live on one GPU host, safely."""
__version__ = "0.1.0"
