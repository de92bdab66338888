"""kdbkit's runtime: devices and backends, compilers, the lookup chain, JIT, and the CLI.

Its public API is re-exported by the ``kdbkit`` package itself; the modules are:
``handle`` (the entry point), ``lookup`` (the chain and its sources), ``jit``, ``program``,
``program_key``, ``kernel_sources``, ``system_bundles``, ``user_cache``, ``compilers``,
``backends``, ``errors``, ``env``, ``logging_setup``, ``paths``, ``cli``.
"""
