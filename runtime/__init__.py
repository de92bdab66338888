"""kdbkit runtime: devices, backends, program resolution, JIT, CLI."""
