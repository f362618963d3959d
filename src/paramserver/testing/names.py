"""The chaos scenarios' names (``scenarios.SCENARIOS``' keys), in a module of their own so that
``paramserver --help`` (``campaign``) need not import the simulation, and the scenarios can
check themselves against the list without importing the campaign back.
"""

SCENARIO_NAMES = ("counters-r1", "counters-r2", "counters-r3", "filters", "job", "job-ssp", "lifecycle",
                  "lossy-peers", "membership", "partition", "pause-crash", "repair-pause", "restart-isolate", "restore",
                  "row-cache", "scheduler-cut", "ssp", "stalled-scheduler", "stalled-server", "tiers",
                  "zombie-forwards")
