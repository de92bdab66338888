"""Builds on a Dask cluster (a LocalCluster of worker processes, as CI runs it): the bundles
equal a one-machine build, ``kdb build --cluster`` works, and a bad address, a worker without
the compiler, another kdbkit or an OpenCL target are each one clear error."""

from __future__ import annotations

import concurrent.futures

import pytest

from kdbkit.kdb import Target, open_bundle
from kdbkit.packager import cluster as dask_cluster
from kdbkit.packager.build import Job, _compile, build, builder_identity, plan
from kdbkit.packager.targets import resolve_targets
from kdbkit.runtime.cli.app import main
from kdbkit.runtime.compilers import AmdgcnClangCompiler
from kdbkit.packager.errors import TargetError
from kdbkit.runtime.errors import CompilerUnavailableError
from kdbkit.runtime.kernel_sources import KernelSearchPath
from kdbkit.runtime.problem import parse_config
from kdbkit.runtime.program_key import ProgramRequest
from tests.packager.test_build import PROBLEMS
from tests.prerequisites import require_amdgcn_clang, require_nvrtc

distributed = pytest.importorskip("distributed", reason="no Dask distributed: pip install 'kdbkit[cluster]'")


def _local_cluster(**worker_kwargs):
    return distributed.LocalCluster(n_workers=worker_kwargs.pop("n_workers", 2), processes=True,
                                    threads_per_worker=1, dashboard_address=":0", **worker_kwargs)


@pytest.fixture(scope="module")
def cluster():
    """A scheduler with two worker processes of one thread each."""
    with _local_cluster() as local:
        yield local.scheduler_address


@pytest.fixture
def offline():
    require_amdgcn_clang()
    require_nvrtc()
    return resolve_targets(["sm_80_108", "gfx942_304"])


def _contents(path):
    with open_bundle(path) as bundle:
        return bundle.metadata.compiler, sorted(bundle.items())


def _error_line(err: str) -> str:
    lines = [line for line in err.strip().splitlines() if not line.startswith("kdbkit warning: ")]
    assert lines and lines[-1].startswith("error: ") and "Traceback" not in err, err
    return " ".join(lines[-1].split())


@pytest.mark.slow  # a Dask cluster of worker processes, and the build twice
def test_a_cluster_build_equals_the_one_machine_build(cluster, offline, tmp_path):
    """The same entries; the same bytes from clang; NVRTC 13.5 compared by key only, as in
    test_build's shard test (one fp16 cubin comes out in either of two forms)."""
    jobs, compilers = plan(offline, [parse_config(p) for p in PROBLEMS])
    local = build(jobs, compilers, tmp_path / "local", parallel=2)
    with dask_cluster.connect(cluster) as client:
        workers = dask_cluster.check_workers(client, compilers.values())
        with distributed.get_task_stream(client) as tasks:
            remote = build(jobs, compilers, tmp_path / "cluster", executor=dask_cluster.executor(client))
    assert len(workers) == 2 and len(tasks.data) == len(jobs)
    assert {t["worker"] for t in tasks.data} == set(workers)  # compiled there, on both
    assert not remote.failures and remote.compiled == len(jobs) and list(remote.bundles) == list(local.bundles)
    for name, path in local.bundles.items():
        (one_compiler, one), (their_compiler, theirs) = _contents(path), _contents(remote.bundles[name])
        assert their_compiler == one_compiler and [(n, a) for n, a, _ in theirs] == [(n, a) for n, a, _ in one]
        if name.startswith("gfx"):
            assert theirs == one


@pytest.mark.slow  # a Dask cluster of worker processes
def test_kdb_build_cluster_builds_with_a_progress_bar(cluster, offline, tmp_path, capsys):
    catalogue = tmp_path / "model.txt"
    catalogue.write_text(PROBLEMS[0] + "\n")
    code = main(["build", "--target", "sm_80_108", "--gpu", "MI300X", "-c", str(catalogue), "--cluster", cluster,
                 "-o", str(tmp_path / "out")])
    out, err = capsys.readouterr()
    assert code == 0 and "2 compiled, 0 already built, 0 failed" in out, err
    assert f"compiling on 2 Dask workers at {cluster}" in err and "2/2" in err  # the bar, at its end
    jobs, _ = plan(offline, [parse_config(PROBLEMS[0])])
    for bundle in ("sm_80", "gfx942"):
        with open_bundle(tmp_path / "out" / f"{bundle}.kdb") as held:
            assert sorted((n, a) for n, a, _ in held.items()) == sorted(
                (j.kernel_name, j.kernel_args) for j in jobs if str(j.bundle) == bundle)


@pytest.mark.slow  # a Dask cluster of worker processes
def test_a_cluster_build_publishes_what_it_collects_keyed_as_a_node_looks_it_up(cluster, tmp_path, capsys):
    """``--publish`` with ``--cluster``: this process, which collects the workers' results,
    stores them; a node with an sm_80 device and this NVRTC finds each under the key its own
    lookup makes (the cluster tier's get, as a handle asks it)."""
    pytest.importorskip("redis", reason="no redis client: pip install 'kdbkit[cluster]'")
    from kdbkit.runtime.compilers import LazyCompiler
    from kdbkit.runtime.lookup import Keys
    from kdbkit.runtime.program import Steps
    from kdbkit.runtime.redis_tier import PREFIX, RedisTier
    from kdbkit.runtime.tier import TierContext
    from tests.prerequisites import require_redis_server
    from tests.runtime.redis_server import RedisServer

    require_nvrtc()
    server = RedisServer(require_redis_server(), tmp_path / "redis")
    try:
        catalogue = tmp_path / "model.txt"
        catalogue.write_text("\n".join(PROBLEMS) + "\n")
        code = main(["build", "--target", "sm_80_108", "-c", str(catalogue), "--cluster", cluster,
                     "--publish", server.url, "-o", str(tmp_path / "out")])
        out = capsys.readouterr().out
        jobs, compilers = plan(resolve_targets(["sm_80_108"]), [parse_config(p) for p in PROBLEMS])
        (identity,) = {c.identity() for c in compilers.values()}
        assert code == 0 and f"{len(jobs)} programs published to {server.url}, for sm_80 devices whose compiler " \
                             f"is {identity}" in out, out
        assert len(server.client().keys(PREFIX + "*")) == len(jobs)
        device = Target.parse("sm_80_108")  # an A100, as the CUDA backend finds it
        node = RedisTier(server.url)
        node.attach(TierContext(device, "cubin", Keys(device, KernelSearchPath()), LazyCompiler(device)))
        with open_bundle(tmp_path / "out" / "sm_80.kdb") as bundle:
            for job in jobs:
                assert node.get(job.request, Steps()) == bundle.get(job.kernel_name, job.kernel_args), job.request
        node.close()
    finally:
        server.stop()


@pytest.mark.parametrize("address", ["tcp://127.0.0.1:1", "nowhere/scheduler.json"])
def test_no_scheduler_at_the_address_is_one_line(address, monkeypatch, capsys, tmp_path):
    require_nvrtc()
    monkeypatch.setattr(dask_cluster, "CONNECT_TIMEOUT_S", 1.0)
    code = main(["build", "--target", "sm_80", "--all", "--cluster", address, "-o", str(tmp_path)])
    line = _error_line(capsys.readouterr().err)
    assert code == 1 and line.startswith(f"error: no Dask scheduler at {address}") and "`dask scheduler`" in line
    assert not list(tmp_path.iterdir())  # nothing built here instead


def test_an_opencl_target_is_refused_before_connecting(capsys):
    code = main(["build", "--target", "ocl-0123456789ab_2", "--all", "--cluster", "tcp://127.0.0.1:1"])
    line = _error_line(capsys.readouterr().err)
    assert code == 1 and "ocl-0123456789ab_2 is an OpenCL target and cannot be built on a cluster" in line
    job = Job(Target.parse("ocl-0123456789ab_2"), ProgramRequest("softmax.c", []), "softmax.c.o", "")
    with concurrent.futures.ThreadPoolExecutor(1) as pool, pytest.raises(TargetError, match="by another executor"):
        build([job], {}, None, executor=pool)


def test_a_worker_without_the_compiler_is_named_with_the_remedy(capsys, tmp_path, amdgcn_clang):
    catalogue = tmp_path / "model.txt"
    catalogue.write_text(PROBLEMS[0] + "\n")
    with _local_cluster(n_workers=1, env={"PATH": str(tmp_path)}) as bare:  # no clang on its PATH
        code = main(["build", "--target", "gfx942", "-c", str(catalogue), "--cluster", bare.scheduler_address,
                     "-o", str(tmp_path / "out")])
        worker = next(iter(bare.scheduler_info["workers"]))
    line = _error_line(capsys.readouterr().err)
    assert code == 1 and f"error: worker {worker} on " in line and "cannot compile for this build: no clang" in line
    assert "install it with `apt-get install clang-19 lld-19` on that worker" in line
    assert not (tmp_path / "out").exists()


def test_each_job_checks_its_workers_kdbkit_and_compiler(amdgcn_clang):
    """A worker that joined after the check, with another clang, refuses the job."""
    compiler = AmdgcnClangCompiler()
    job = Job(Target.parse("gfx942"), ProgramRequest("softmax.c", []), "softmax.c.o", "")
    source = KernelSearchPath().read("softmax.c")
    binary, error, _ = _compile(compiler, job, source, "kdbkit 0.0.1, clang 1.0.0")
    message = error.problem
    assert binary is None and f"has {builder_identity(compiler)}, not kdbkit 0.0.1, clang 1.0.0" in message
    assert _compile(compiler, job, source, builder_identity(compiler))[0]


def test_worker_problems_name_each_worker_and_what_it_lacks():
    version = dask_cluster.__version__
    ok = {"kdbkit": version, "host": "h1", "compilers": [("nvrtc 13.5", "", "")]}
    facts = {
        "tcp://a:1": ok,
        "tcp://b:1": ModuleNotFoundError("No module named 'kdbkit'"),
        "tcp://c:1": {**ok, "kdbkit": "0.0.1", "host": "h3"},
        "tcp://d:1": {**ok, "host": "h4", "compilers": [("nvrtc 12.8", "", "")]},
        "tcp://e:1": {**ok, "host": "h5",
                      "compilers": [(None, "NVRTC is not available", "pip install 'kdbkit[cuda]'")]},
    }
    assert dask_cluster.worker_problems(facts, ["nvrtc 13.5"]) == [
        ("tcp://b:1", "has no kdbkit", f"pip install 'kdbkit=={version}' on it, or stop that worker"),
        ("tcp://c:1", f"on h3 has kdbkit 0.0.1, this machine {version}",
         f"pip install 'kdbkit=={version}' on it, or build here"),
        ("tcp://d:1", "on h4 has nvrtc 12.8, this machine nvrtc 13.5 (a key names its compiler)",
         "install the same compiler version on both"),
        ("tcp://e:1", "on h5 cannot compile for this build: NVRTC is not available",
         "pip install 'kdbkit[cuda]' on that worker, or stop it"),
    ]


def test_a_scheduler_with_no_worker_is_named():
    with distributed.LocalCluster(n_workers=0, processes=False, dashboard_address=":0") as empty:
        expected = f"the Dask scheduler at {empty.scheduler_address} has no worker after 0.5 s; start some with"
        with pytest.raises(CompilerUnavailableError, match=expected):
            dask_cluster.connect(empty.scheduler_address, timeout=0.5)


@pytest.mark.slow  # a Dask cluster and a whole-arch build
def test_ctrl_c_stops_a_cluster_build_with_one_line_and_no_partial_files(cluster, tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    require_amdgcn_clang()
    env = {k: v for k, v in os.environ.items() if not k.startswith("KDB_")}
    out = tmp_path / "out"
    build = subprocess.Popen([sys.executable, "-c", "import sys; from kdbkit.runtime.cli.app import main; "
                              "sys.exit(main())", "build", "--target", "gfx942_304", "--all", "--cluster", cluster,
                              "-o", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                             start_new_session=True)
    time.sleep(4.0)  # connected, and compiles under way on the workers
    assert build.poll() is None, build.communicate()
    start = time.monotonic()
    os.killpg(build.pid, signal.SIGINT)
    try:
        _, err = build.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(build.pid, signal.SIGKILL)
        pytest.fail(f"kdb build --cluster did not exit within 10 s of Ctrl-C:\n{build.communicate()[1][-3000:]}")
    print(f"kdb build --cluster exited {time.monotonic() - start:.2f} s after Ctrl-C")
    assert build.returncode == 130, err[-3000:]
    assert [line for line in err.splitlines() if "aborted" in line] == ["aborted"], err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert not out.exists() or not list(out.iterdir())
