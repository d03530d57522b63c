"""Base classes plugin implementations subclass. Submodules import torch where needed."""
