"""Supervised fine-tuning: rows of input_ids/labels, the training loop, saving checkpoints."""
