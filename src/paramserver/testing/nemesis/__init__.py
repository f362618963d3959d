"""Real processes on emulated hosts under real network faults (issue 47): ``hosts`` (namespaces on
a bridge, nftables and tbf), ``plan`` (a seeded schedule of faults), ``workload`` (the counters'
client), ``run`` (one run, supervised, with deadlines), ``check`` (what a run must show) and
``campaign`` (``paramserver nemesis``)."""
