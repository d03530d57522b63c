"""Serving LoRA adapters: requests, adapter folders, device slots, the served-adapter table."""

from engine.lora.request import LoRARequest

__all__ = ["LoRARequest"]
