"""rollwise: RL post-training for LLMs with verifiable rewards, spending rollouts where they teach."""

__version__ = "0.1.0"
