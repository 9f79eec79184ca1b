"""The executor: forward, backward and update of a model; the optimizer; the training loop."""
