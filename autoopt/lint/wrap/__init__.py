"""`autoopt rewrite --wrap`: find the training loop, bind the model, loader and optimizer it
really uses, and insert the one `autoopt.optimize()` call (or decline, saying why)."""
