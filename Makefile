# make demo: set up .venv and run the main job on a local cluster
# make test: set up .venv with the dev, torch, ray, serve and redis extras (and Debian's chromium, redis-server and nftables), lint, then run the in-process
#   tests, then the process tests
# make unit: the in-process tests alone (under 2 minutes), for the edit-test loop
# make lint: ruff (style, imports, likely bugs, complexity), mypy (types; strict on the core), the layers
#   (import-linter's contract in pyproject.toml), the sizes of files and functions (tools/shape.py) and the
#   ties inside and between rooms: no circle of imports, no private name across rooms (tools/ties.py), and tests
#   that can fail: every test function asserts, directly or through a helper (tools/asserts.py)
# make headline: bench/headline.py, the comparisons the project is judged by, in one table (HEADLINE_FLAGS="--quick" etc.)
# make pslite: ps-lite's stock server from its source (Debian's libzmq and protobuf) and our driver for it
#   (bench/pslite/build.sh), under ~/.cache/paramserver/pslite: bench/pushpull.py and the headline then set
#   push/pull against it (PSLITE_FLAGS="--pslite-src DIR" builds another checkout)
# make seeds: bench/seeds.py, against Spark MLlib and TensorFlow (a venv of its own: .venv-seeds; SEEDS_FLAGS="--sections lr" etc.)
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: chaos demo test unit lint bench headline pslite seeds clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# the package's bytecode is compiled here: an editable install leaves it to the first import,
# and where PYTHONDONTWRITEBYTECODE is set (as on this machine) every command compiled
# every module again, 0.06 s of each start-up
# and the kernels the quick start, train's default jobs and the round apps run are compiled into numba's
# cache (about two minutes on a fresh machine, once: paramserver prewarm says so first, then a line a group
# of kernels), so that the first `paramserver demo`, train, lasso, mf or lda starts in seconds
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .
	$(BIN)/python -m compileall -q src
	$(BIN)/paramserver prewarm
	touch $@

# the torch and ray extras are part of the product (paramserver.torch, paramserver.ray): their tests run, not skip
$(VENV)/.installed-dev: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[dev,torch,ray,serve,redis]'
	$(BIN)/python -m compileall -q src
	touch $@ $(VENV)/.installed

demo: $(VENV)/.installed
	$(BIN)/paramserver demo

# the dashboard's test drives a real headless browser: Debian's chromium (root, or sudo, installs it)
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
/usr/bin/chromium:
	$(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq chromium

# the streaming tests read from a real Redis (Debian's redis-server), which they start and stop themselves
/usr/bin/redis-server:
	$(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq redis-server

# the emulated hosts of tests/process/test_nemesis.py cut and thin links with nftables (Debian's nftables)
/usr/sbin/nft:
	$(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq nftables

unit: $(VENV)/.installed-dev
	$(BIN)/python -m pytest -q --ignore=tests/process

# the kernels compile into numba's cache on the second core while the first lints (paramserver prewarm --all)
test: $(VENV)/.installed-dev /usr/bin/chromium /usr/bin/redis-server /usr/sbin/nft
	$(BIN)/paramserver prewarm --all & warm=$$!; $(MAKE) lint; linted=$$?; wait $$warm; warmed=$$?; \
		[ $$linted = 0 ] && [ $$warmed = 0 ]
	# the chaos campaign (one core, a simulation: no sockets, no clocks) beside the in-process tests, which
	# run on both cores (pytest-xdist): on a fresh clone they compile what prewarm does not (the tests' own
	# tables and rows), 234 s on one core and 134 on two before prewarm ran the round apps
	log=$$(mktemp); $(BIN)/paramserver chaos --seeds 300 --first-seed 1000 > $$log 2>&1 & chaos=$$!; \
		$(BIN)/python -m pytest -q -n 2 --ignore=tests/process; tested=$$?; wait $$chaos; chaosed=$$?; \
		cat $$log; rm -f $$log; [ $$tested = 0 ] && [ $$chaosed = 0 ]
	# the process tests on both cores too, a file at a time (a module's cluster is started once), the longest
	# files first (tests/process/conftest.py; pytest-xdist would otherwise hand out the files with the most
	# tests first): 544 s where one core took 708
	$(BIN)/python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder --durations=15 tests/process \
		--ignore=tests/process/test_torch.py --ignore=tests/process/test_pipeline.py --ignore=tests/process/test_ray.py
	# apart: a process that has loaded torch or joined Ray spawns its cluster's nodes instead of forking them
	$(BIN)/python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder tests/process/test_torch.py \
		tests/process/test_pipeline.py tests/process/test_ray.py

# the fault-injection campaign of the issue's acceptance: 500 seeds over every scenario
chaos: $(VENV)/.installed-dev
	$(BIN)/paramserver chaos --seeds 500 --json

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check src tests bench tools
	$(BIN)/mypy
	$(BIN)/lint-imports --no-cache
	$(BIN)/python tools/shape.py
	$(BIN)/python tools/ties.py
	$(BIN)/python tools/asserts.py
	$(BIN)/python tools/doclinks.py

bench: $(VENV)/.installed-dev
	$(BIN)/python -m pip install --quiet -e ".[bench]" && $(BIN)/python bench/pushpull.py && $(BIN)/python bench/train.py

# issue 44.4: train vs VW, lasso vs scikit-learn and celer, MF vs Surprise, LDA vs tomotopy, push/pull, each
# ratio with its goal and PASS or FAIL (long: lasso at λ_max/2000 and MF on 4 M ratings take minutes a repeat; take
# it on a quiet machine)
headline: $(VENV)/.installed-dev
	$(BIN)/python -m pip install --quiet -e ".[bench]" && $(BIN)/python bench/headline.py $(HEADLINE_FLAGS)

# issue 44.3: the peer of bench/pushpull.py, built outside the repository (ps-lite's own Makefile downloads its
# dependencies: build.sh uses its CMakeLists.txt against Debian's packages, which it installs where missing)
pslite:
	bash bench/pslite/build.sh $(PSLITE_FLAGS)

# bench/seeds.py: against Spark MLlib and TensorFlow's parameter-server training (issue 34), in a venv of its
# own (pyspark and tensorflow-cpu are ~1.5 GB and never meet the test environment); Spark needs Java 17+
SEEDS := .venv-seeds
$(SEEDS)/.installed: pyproject.toml
	$(PYTHON) -m venv $(SEEDS)
	$(SEEDS)/bin/python -m pip install --quiet --upgrade pip
	$(SEEDS)/bin/python -m pip install --quiet -e '.[seeds]'
	touch $@

# MXNet 1.9.1 (2022, the project is retired) imports only beside numpy < 1.24: a venv of its own, optional
.venv-mxnet/.installed:
	$(PYTHON) -m venv .venv-mxnet
	.venv-mxnet/bin/python -m pip install --quiet 'mxnet==1.9.1' 'numpy<1.24' && touch $@ || \
		echo "make seeds: MXNet did not install; bench/seeds.py skips it and says why"

seeds: $(SEEDS)/.installed .venv-mxnet/.installed
	@command -v java >/dev/null || { echo "make seeds: Spark needs Java 17+ (Debian: apt-get install openjdk-17-jre-headless)"; exit 1; }
	$(SEEDS)/bin/python bench/seeds.py $(SEEDS_FLAGS)

clean:
	rm -rf $(VENV) $(SEEDS) .venv-mxnet build src/*.egg-info .pytest_cache
