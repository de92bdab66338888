"""kdbkit (placeholder while the reshape lands; replaced by the lazy public API)."""
