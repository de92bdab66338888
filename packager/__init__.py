"""kdbkit's offline side: targets, compilers, build planner, packages, installer.

Empty for now: the packaging issue builds it on top of ``kdb`` (bundles) and
``runtime.backends`` (the offline compilers ``nvrtc.compile_cuda`` and
``amdgcn_clang.compile_amdgcn``, which need no GPU).
"""
