"""NumPy references of the primitives: what every kernel's result is checked against."""
