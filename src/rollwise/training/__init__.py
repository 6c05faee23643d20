"""Training: log-probs, the policy update, checkpoints."""
