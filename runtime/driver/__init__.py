"""``kdb driver``: MIOpenDriver's equivalent. Runs one primitive's problem with random inputs on a
device, verifies it against the NumPy reference and times it, printing MIOpenDriver's lines.

Modules:
    spec: :class:`DriverSpec` (what a primitive declares) and the common flags.
    registry: the list of primitive modules; the command line KDB_ENABLE_LOGGING_CMD logs.
    tensors: host tensors laid out with a problem's strides, bf16/fp16 rounding.
    run: one problem: solver (immediate, find or asked), run, time, verify.
    verify: the error measure.  lines: the output lines.
    activ, softmax, tensorop, lnorm: one module per primitive.
The typer commands are built from the specs in ``runtime/cli/driver_command.py``.

Adding a primitive (say pooling, as ``kdb driver pool``) means one module and one word:

1. ``runtime/driver/pool.py``::

       from kdbkit.runtime.driver.spec import DriverSpec, Flag
       from kdbkit.runtime.primitives.pooling.problem import PoolingProblem
       from kdbkit.runtime.reference import pooling as ref

       class Pool(DriverSpec):
           command, label, log_label, primitive = "pool", "Pooling", "LogCmdPooling", "pool"
           summary = "Pooling forward and backward, as MIOpenDriver pool."
           example = "kdb driver pool -n 2 -c 4 -H 8 -W 8 -y 2 -x 2 -t 1"   # runs in CI: keep it small
           flags = (Flag("mode", ("-m", "--mode"), str, "max", "max, avg or avg_in.", choices=("max", "avg", "avg_in")),
                    Flag("win_h", ("-y",), int, 2, "Window height.", minimum=1), ...)

           def problem(self, o, direction, dtype):   # o.shape is (N, C, H, W); o.<dest> per flag
               return PoolingProblem(direction, o.mode, dtype, o.shape, ...)

           def outputs(self, p):                     # the tensors it writes, checked
               return ("y",) if p.direction == "fwd" else ("dx",)

           def prepare(self, p, t):                  # optional: consistent inputs (t.set)
               ...

           def reference(self, p, t):                # float64 expected values per output
               return {"y": ref.forward(t["x"], ...)}  # t[name]: a tensor's initial values

       SPEC = Pool()

   Every tensor of ``problem.tensors()`` starts random (seeded) and strided as the problem
   says; ``unused(p)`` names tensors the invoker takes but the problem ignores. Override
   ``tolerance(p)`` if the type's default (``spec.TOLERANCES``) does not fit.
2. Add ``"pool"`` to ``registry.MODULES``.

That gives ``kdb driver pool`` (and ``poolfp16``, ``poolbfp16``), ``--config``, ``-S``, ``-F``,
timing, verification, and the ``[LogCmdPooling]`` line for every pooling call. A primitive whose
flags differ from the defaults: ``shape_flags = False`` drops ``-n -c -H -W`` (gemm's ``-m -n
-k``), ``directional = False`` drops ``-F`` (tensorop); one whose ``-F`` means something else
(bnorm's train/inference) sets ``directional = False``, declares its own ``-F`` flag and
overrides ``problems``, ``config_problems``, ``phase`` and ``command_flags``.
"""
