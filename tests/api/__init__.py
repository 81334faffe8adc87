"""The public surface and its one error tree for bad input."""
