# The two commands of the README: `make demo` and `make test` (and `make bench`, `make wheel`).
# They work on a stock Debian 12 as root: Debian's packages come from apt, and the project with its
# Python dependencies goes into a virtual environment in the checkout (.venv), because Debian's own
# Python is externally managed (PEP 668) and refuses `pip install`. Re-running installs nothing that
# has not changed: each step leaves a stamp and is redone only when its inputs change.
PYTHON ?= python3
VENV ?= .venv
PY = $(VENV)/bin/python
# python3-venv/python3-dev: the venv and the C extension's headers for Debian's python3;
# etcd: the control plane the tests and the demo start; iproute2/iptables/nftables: what the daemon
# drives; iperf3/ping: the bench's and the demo's measuring tools; gcc: the C engine and the traffic
# generator; clang and its sanitizer runtime: the fuzz tests; systemd: the unit file is verified;
# the Debian packaging tools: the package is built and installed by the tests;
# containernetworking-plugins: the real `bridge` and `host-local` CNI plugins (/usr/lib/cni), with
# which the dual-stack tests make pods from subnet.env as flannel's CNI plugin has them made;
# libbpf-dev: the kernel path's loader (libbpf) and its programs' headers; ethtool: the kernel
# path's bench and tests switch the sender's UDP tunnel segmentation off (docs/kernel-path.md).
APT_PACKAGES = python3-venv python3-dev etcd-server etcd-client iproute2 iputils-ping iperf3 \
  iptables nftables gcc clang libclang-rt-14-dev libbpf-dev ethtool systemd containernetworking-plugins \
  $(DEB_BUILD_PACKAGES)
APT_STAMP = $(VENV)/.apt-installed
PIP_STAMP = $(VENV)/.pip-installed
# The versions the suite runs with, and the package bundles (packaging/constraints.txt).
CONSTRAINTS = packaging/constraints.txt
# What `make deb` builds with: Debian's packaging tools (dh-virtualenv makes the package's venv
# with Debian's python3) and lintian, which checks the result.
DEB_BUILD_PACKAGES = build-essential debhelper dh-virtualenv python3-dev python3-venv help2man \
  lintian

.PHONY: deps test demo bench wheel deb constraints clean

$(APT_STAMP): Makefile
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi
	@test -x $(PY) || { echo "creating the virtual environment $(VENV) ($(PYTHON))"; $(PYTHON) -m venv $(VENV); }
	@touch $@

$(PIP_STAMP): $(APT_STAMP) pyproject.toml setup.py csrc/*.c csrc/*.h csrc/build_ffi.py csrc/sources.txt \
  csrc/bpf/maps.h csrc/bpf/build_ffi.py dataplane/engine/bpf_cdef.py $(CONSTRAINTS)
	@echo "installing flannel-udp and its extras into $(VENV)"
	$(PY) -m pip install -q --disable-pip-version-check -c $(CONSTRAINTS) -e '.[test,demo,bench]'
	@touch $@

deps: $(PIP_STAMP)

test: deps
	$(PY) -m pytest

# The story through an engine, then the same ping through the kernel path (the daemon's default
# where its programs load). Where they cannot load (no clang, an old kernel, ...) the second part
# says why (exit 3) and is skipped: the demo passes on any host that runs the engines.
demo: deps
	$(VENV)/bin/flannel-udp demo
	@echo; echo "make demo: now the same ping through the kernel path (flannel-udp demo --engine kernel)"
	@$(VENV)/bin/flannel-udp demo --engine kernel; rc=$$?; \
	if [ $$rc -eq 3 ]; then echo "make demo: the kernel path's part is skipped here (the reason is above)"; \
	elif [ $$rc -ne 0 ]; then exit $$rc; fi

bench: deps
	$(VENV)/bin/flannel-udp bench

# A wheel with the compiled C engine, for hosts without a compiler (docs/operating.md#install).
wheel: $(APT_STAMP)
	$(PY) -m pip wheel --no-deps -w dist .

# flannel-udp_<version>_<arch>.deb in dist/, built by Debian's tools from a copy of the tracked
# files (so the checkout's own build products stay out of it), then checked by lintian
# (debian/flannel-udp.lintian-overrides says why each override is there).
deb:
	@missing=""; for p in $(DEB_BUILD_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi
	packaging/build-deb dist

# The engine tests, the multi-queue tests and the fuzzers' corpora on another architecture
# (ARCH=arm64 or s390x) under QEMU user-mode emulation, in a Debian 12 root of ARCH made once
# outside the checkout (FLANNEL_UDP_ARCH_DIR, default /var/cache/flannel-udp/arch/ARCH); the
# steps and what emulation cannot run are in tests/arch/run.sh and tests/arch/emulated.py. On arm64
# it ends with an arm64 daemon beside this machine's in one overlay (tests/arch/check_cross_arch.py,
# which runs on this machine's .venv: hence deps). ARCH_STEPS picks steps (e.g. 'install deb cross').
test-arch: deps
	@test -n "$(ARCH)" || { echo "usage: make test-arch ARCH=arm64|s390x [ARCH_STEPS='root install ...']"; exit 2; }
	tests/arch/run.sh $(ARCH) $(ARCH_STEPS)

# Re-resolve pyproject.toml's ranges to the newest releases and pin them in $(CONSTRAINTS).
constraints: $(APT_STAMP)
	rm -rf build/constraints-venv && $(PYTHON) -m venv build/constraints-venv
	build/constraints-venv/bin/pip install -q --disable-pip-version-check '.[test,demo,bench]'
	{ sed -n '/^#/p' $(CONSTRAINTS); build/constraints-venv/bin/pip freeze --exclude flannel-udp \
	  | sort -f; } > $(CONSTRAINTS).new && mv $(CONSTRAINTS).new $(CONSTRAINTS)
	rm -rf build/constraints-venv

clean:
	rm -rf build dist *.egg-info dataplane/_dataplane_c*.so dataplane/_dataplane_c.c $(VENV)
