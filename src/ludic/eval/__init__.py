"""Evaluation beyond sampled episodes: exact game-tree evaluation and report statistics."""
