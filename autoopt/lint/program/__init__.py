"""The model of the user's program that every rule, fix and `--wrap` asks: training and
evaluation loops, the device, the models, loaders and optimizers, what other modules of the
project define, and what libraries already take care of."""
