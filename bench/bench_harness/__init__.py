"""What the benchmark scripts share, one concept a module (imported as ``bench_harness.<module>``:
the scripts run from ``bench/``, which Python puts first on their path; not ``harness``, the
name ``tests/unit/harness.py`` already has where a test imports a script).

- ``procs``: the processes a script starts (each in a session of its own, stopped in
  ``finally``), waiting on a condition, free ports, a command that must finish.
- ``memory``: a command run while its whole process tree's peak RSS and PSS are sampled.
- ``timing``: learners taking turns (so a slow spell of the shared VM hits each alike), and
  the median of a list.
- ``namespaces``: two network namespaces joined by a veth pair (optionally rate-shaped).
- ``relays``: the command of a userspace link of a given delay and rate (``delayrelay.c``,
  compiled once, else ``delayproxy.py``), where the kernel has no ``netem``.
- ``markdown``: the tables the scripts print (numbers formatted one way everywhere).

The peers themselves (ps-lite's driver, Spark, TensorFlow, MXNet) are run by their own
scripts: ``pslite/``, ``seeds_spark.py``, ``seeds_tf.py``, ``seeds_mxnet.py``, measured with
``memory.measure``.
"""
