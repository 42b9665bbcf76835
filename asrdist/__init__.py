"""asrdist: data-parallel training of speech acoustic models on torch.distributed."""

__version__ = "0.1.0"
