"""Task mixtures (reasoning-gym generators and local files) and prompt formatting."""

from rollwise.data.prompts import encode_prompts, format_prompt
from rollwise.data.tasks import build_items

__all__ = ["build_items", "encode_prompts", "format_prompt"]
