"""Measuring on the spot: the choices tried at the first training step, replaying a forward as if it
had not run, and timing candidates in turn."""
