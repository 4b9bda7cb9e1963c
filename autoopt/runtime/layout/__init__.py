"""What a memory layout changes beside speed: the random draws that follow it."""
