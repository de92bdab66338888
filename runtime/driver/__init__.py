"""``kdb driver``: MIOpenDriver's equivalent. Runs one primitive's problem with random inputs on a
device, verifies it against the NumPy reference and times it, printing MIOpenDriver's lines.

Modules:
    spec: :class:`DriverSpec` (what a primitive declares) and the common flags.
    registry: the commands, found (each module that assigns ``SPEC``, and the ``driver`` module
        of each primitive an entry point adds); the command line KDB_ENABLE_LOGGING_CMD logs.
    tensors: host tensors laid out with a problem's strides, bf16/fp16 rounding.
    run: one problem: solver (immediate, find or asked), run, time, verify.
    verify: the error measure.  lines: the output lines.
    activ, softmax, tensorop, lnorm, pool, bnorm, gemm: one module per primitive.
    commands: ``kdb driver``'s typer commands, built from the specs, and the parser of a driver
        command (:func:`~kdbkit.runtime.driver.commands.problems_of_command`) that the offline
        builder reads catalogues with; the CLI mounts them.

Adding a primitive's command means one module (found: nothing to list); ``pool.py`` (``kdb
driver pool``) is the plain case:

1. ``runtime/driver/pool.py``::

       from kdbkit.runtime.driver.spec import DriverSpec, Flag
       from kdbkit.runtime.primitives.pooling.problem import MODES, PoolProblem
       from kdbkit.runtime.reference import pooling as ref

       class Pool(DriverSpec):
           command, label, log_label, primitive = "pool", "Pooling", "LogCmdPooling", "pool"
           summary = "Max and average pooling forward and backward, as MIOpenDriver pool."
           example = "kdb driver pool -n 2 -c 4 -H 8 -W 8 -y 3 -x 3 ... -t 1"  # runs in CI: keep it small
           flags = (Flag("mode", ("-m", "--mode"), str, "max", "Mode: ...", choices=MODES),
                    Flag("win_h", ("-y", "--win_h"), int, 2, "Window height.", minimum=1), ...)

           def problem(self, o, direction, dtype):   # o.shape is (N, C, H, W); o.<dest> per flag
               return PoolProblem(direction, o.mode, dtype, o.shape, (o.win_h, o.win_w), ...)

           def outputs(self, p):                     # the tensors it writes, checked
               return ("y",) if p.direction == "fwd" else ("dx",)

           def unused(self, p):                      # taken by the invoker, not float values
               return ("indices",)

           def prepare(self, p, t):                  # optional: consistent inputs (t.set)
               ...                                   # backward max: indices of a forward

           def reference(self, p, t):                # float64 expected values per output
               return {"y": ref.forward(t["x"], ...)[0]}  # t[name]: a tensor's initial values

       SPEC = Pool()

   Every tensor of ``problem.tensors()`` starts random (seeded) and strided as the problem
   says; ``unused(p)`` names tensors the invoker takes that are not checked (a weight's
   gradient without a weight, pooling's int32 indices). Override ``tolerance(p)`` if the
   type's default (``spec.TOLERANCES``) does not fit. Describe the problem from the flags as
   the primitive's Python call describes it (same config string, so the same find-db record:
   tests/runtime/driver/test_driver.py checks it for pool, bnorm and gemm).
2. Nothing else: :func:`~kdbkit.runtime.driver.registry.specs` finds every module here that
   assigns ``SPEC``. A primitive added from outside kdbkit (entry point ``kdbkit.primitives``)
   keeps its spec in its own ``driver`` module instead (tests/runtime/primitives/test_added_primitive.py).

That gives ``kdb driver pool`` (and ``poolfp16``, ``poolbfp16``), ``--config``, ``-S``, ``-F``,
timing, verification, and the ``[LogCmdPooling]`` line for every pooling call. A primitive whose
flags differ from the defaults: ``shape_flags = False`` drops ``-n -c -H -W`` (``gemm.py``:
``-m -n -k``), ``directional = False`` drops ``-F`` (``tensorop.py``, ``gemm.py``); one whose
``-F`` means something else (``bnorm.py``: 1 training, 2 inference, with ``-b`` for backward)
sets ``directional = False``, declares its own ``-F`` flag (dest ``forw``, which ``--config``
checks through ``config_problems``) and overrides ``problems``, ``config_problems``, ``phase``,
``forw_of`` and ``command_flags``.

Verification compares float values only (one error measure per problem, ``verify.py``): an
integer output, such as forward max pooling's indices, is not compared.
"""
