"""The training recipe (paper section 5) beside `train_accelerate.py`: Adam and its schedule, the loss, checkpoints,
evaluation, the run's output folder, and the Table 3 sweep."""
