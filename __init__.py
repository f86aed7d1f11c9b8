"""specedge: on-device speculative decoding for small language models, losslessly."""
__version__ = "0.1.0"
