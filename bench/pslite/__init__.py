"""ps-lite's stock server beside ours, measured in the same run (issue 44.3).

* ``build.sh`` (``make pslite``): ps-lite's library from its source, against Debian's libzmq and
  protobuf, and our driver linked against it, all under ``~/.cache/paramserver/pslite``;
* ``pushpull.cc``: the driver (our code): ps-lite's ``KVServer<float>`` with its stock
  ``KVServerDefaultHandle``, and a worker timing pulls and pushes;
* ``driver.py``: starts the driver's scheduler, server and worker, reads its figures, and sets
  them against ours (``bench/pushpull.py``, ``bench/headline.py``).

Nothing of ps-lite's source or build is in the repository.
"""
